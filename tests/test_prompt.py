"""Prompt rendering: query-agnostic split through the chat template, protected prefix, middle truncation."""

from __future__ import annotations

import dataclasses

import pytest

from kvbench.errors import KvbenchError
from kvbench.models import byte_tokenizer
from kvbench.prompt import prompt_length, prompt_text, render
from kvbench.tasks import Context, Question


def _ctx(body: str, instruction: str = "Read this.", questions=None) -> Context:
    questions = questions or (Question("0", "What is x?", "Answer:", 16, ("1",), ("string_match_all",)),)
    return Context("b", "t", "0", instruction, body, tuple(questions))


def test_pieces_concatenate_to_the_full_chat_prompt():
    tok = byte_tokenizer()
    ctx = _ctx("alpha beta gamma")
    r = render(tok, ctx)
    full = tok.apply_chat_template(
        [{"role": "user", "content": "Read this.\nalpha beta gamma\nWhat is x?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    expected = tok(full + "Answer:", add_special_tokens=False)["input_ids"]
    assert r.prefix_ids + r.body_ids + r.question_ids[0] == expected
    assert tok.decode(r.prefix_ids) == "<|im_start|>user\nRead this.\n"
    assert r.prot == len(r.prefix_ids) and r.truncated_from is None


def test_protected_prefix_is_capped_at_256():
    r = render(byte_tokenizer(), _ctx("body", instruction="x" * 400))
    assert len(r.prefix_ids) > 256 and r.prot == 256


def test_middle_truncation_keeps_first_and_last_halves():
    tok = byte_tokenizer()
    body = "".join(chr(ord("a") + i % 26) for i in range(1000))
    ctx = _ctx(body)
    full = render(tok, ctx)
    limit = 600
    r = render(tok, ctx, max_length=limit)
    need = len(r.question_ids[0]) + 16
    room = limit - len(r.prefix_ids) - need
    assert r.truncated_from == len(full.context_ids)
    assert len(r.body_ids) == room
    assert r.body_ids == full.body_ids[: room // 2] + full.body_ids[-(room - room // 2) :]
    assert len(r.context_ids) + need == limit


def test_contexts_that_cannot_fit_are_an_error():
    with pytest.raises(KvbenchError, match="instruction and questions alone"):
        render(byte_tokenizer(), _ctx("body", instruction="y" * 300), max_length=200)
    with pytest.raises(KvbenchError, match="empty context body"):
        render(byte_tokenizer(), _ctx(""))


def test_tokenizer_without_chat_template_gets_plain_text():
    tok = byte_tokenizer()
    tok.chat_template = None
    r = render(tok, _ctx("body"))
    # RULER's base template: a space between the question and the answer prefix ("...text? The special...")
    assert tok.decode(r.prefix_ids + r.body_ids + r.question_ids[0]) == "Read this.\nbody\nWhat is x? Answer:"
    assert prompt_text(tok, _ctx("body")) == "Read this.\nbody\nWhat is x? Answer:"
    no_prefix = _ctx("body", questions=(Question("0", "What is x?", "", 16, ("1",), ("string_match_all",)),))
    assert prompt_text(tok, no_prefix) == "Read this.\nbody\nWhat is x?"  # no trailing space


def test_glue_joins_instruction_and_body():
    tok = byte_tokenizer()
    tok.chat_template = None
    ctx = dataclasses.replace(_ctx("body"), glue=" ")  # RULER's fwe joins them with a space
    r = render(tok, ctx)
    assert tok.decode(r.prefix_ids) == "Read this. "
    assert tok.decode(r.prefix_ids + r.body_ids + r.question_ids[0]) == prompt_text(tok, ctx)


def test_prompt_length_counts_the_whole_prompt_in_one_piece():
    """RULER counts ``input + answer_prefix`` tokenized at once. A BPE whose merges cross the piece
    boundaries ("x\ny" is one token) gives fewer tokens than the three pieces render produces."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(["I", "\n", "b", "Q", " ", "A", "I\n", "I\nb", "b\n", "b\nQ"])}
    merges = [("I", "\n"), ("I\n", "b"), ("b", "\n"), ("b\n", "Q")]
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    bpe.pre_tokenizer = pre_tokenizers.Split("@", "removed")  # no pre-split: merges may cross "\n"
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe)
    ctx = _ctx("b", instruction="I", questions=(Question("0", "Q", "A", 4, ("1",), ("string_match_all",)),))
    assert prompt_text(tok, ctx) == "I\nb\nQ A"
    r = render(tok, ctx)
    pieces = len(r.prefix_ids) + len(r.body_ids) + len(r.question_ids[0])
    whole = prompt_length(tok)
    # whole: "I\nb" "\n" "Q" " " "A" (5); pieces: "I\n" | "b" | "\n" "Q" " " "A" (6)
    assert whole(ctx) == len(tok("I\nb\nQ A", add_special_tokens=False)["input_ids"]) == 5
    assert pieces == 6
    assert whole.text_tokens("I\nb") == 1
