"""The tiny model's tokenizer: byte-level BPE with every digit its own token and the ChatML specials."""

from __future__ import annotations

import random

from kvbench.models import CHAT_TEMPLATE, SPECIAL_TOKENS
from kvbench.tasks.calibration_corpus import synthetic_text
from kvbench_training.data import DENSE_TASKS, TASK_MIX, TRAIN_SEED_BASE, answer_text, ruler_bench


def tokenizer_corpus(n_per_task: int = 4) -> list[str]:
    """Deterministic training text for the tokenizer: RULER contexts of every training task (seeds >=
    TRAIN_SEED_BASE, byte-tokenizer sizing at 2,048), the task templates and synthetic text."""
    from kvbench.models import byte_tokenizer
    from kvbench.prompt import prompt_length

    measure = prompt_length(byte_tokenizer())
    texts: list[str] = []
    for task, _ in TASK_MIX:
        if task in DENSE_TASKS:
            continue
        for i in range(n_per_task):
            seed = TRAIN_SEED_BASE + 7919 * i + 1
            for ctx in ruler_bench().contexts(task, length=3000, limit=1, seed=seed, prompt_length=measure):
                for q in ctx.questions:
                    texts.append(
                        "\n".join((ctx.instruction, ctx.body, q.text, q.answer_prefix, answer_text(ctx.task, q)))
                    )
    rng = random.Random("kvbench-tokenizer")
    texts.extend(synthetic_text(rng, 6000) for _ in range(4))
    return texts


def train_tokenizer(texts: list[str] | None = None, vocab_size: int = 2048):
    """Byte-level BPE of ``vocab_size`` tokens with every digit a single token and the ChatML specials (eos
    ``<|im_end|>``, pad ``<|endoftext|>``, kvbench's ``CHAT_TEMPLATE``), as a ``PreTrainedTokenizerFast``.
    Deterministic for the same ``texts``; ``None`` trains on :func:`tokenizer_corpus`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if texts is None:
        texts = tokenizer_corpus()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        model_max_length=8192,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
