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


def test_truncation_leaves_room_for_the_largest_question_and_answer():
    """The body is cut so that every question fits with its answer budget: the room is sized from the largest
    ``len(question) + max_new_tokens`` (here the second question's), not from the first question's."""
    tok = byte_tokenizer()
    body = "".join(chr(ord("a") + i % 26) for i in range(1000))
    first = Question("0", "x?", "A:", 4, ("1",), ("string_match_all",))
    second = Question("1", "What is the value of the variable named y, exactly?", "Answer:", 64, ("2",), ("s",))
    limit = 600
    r = render(tok, _ctx(body, questions=(first, second)), max_length=limit)
    questions = (first, second)
    needs = [len(tok(q.text, add_special_tokens=False)["input_ids"]) + q.max_new_tokens for q in questions]
    assert needs[1] > needs[0]  # the second question needs the most
    n = len(r.context_ids)
    totals = [n + len(ids) + q.max_new_tokens for ids, q in zip(r.question_ids, questions, strict=True)]
    assert max(totals) == limit and totals[1] == limit  # the largest fills the limit exactly, the others fit


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


# --- SCBench's own assembly (context.assembly == "scbench") ------------------------------------------------


def _sc(body: str, instruction: str = "Read.\n\n", reserve: int = 0, questions=None) -> Context:
    questions = questions or (
        Question("0", "Q one?", "", 4, ("a",), ("string_match_all",)),
        Question("1", "Q two?", "", 8, ("b",), ("string_match_all",)),
    )
    return Context("scbench", "t", "0", instruction, body, tuple(questions), glue="", assembly="scbench",
                   reserve_tokens=reserve)  # fmt: skip


def test_scbench_assembly_is_the_official_text_with_no_separator():
    """Hand-worked: context = chat head + instruction + body (no "\\n" glue, no end of turn); each query =
    its text + end of turn + assistant header, appended directly (no "\\n" before it)."""
    tok = byte_tokenizer()
    r = render(tok, _sc("    indented body"))
    assert tok.decode(r.context_ids) == "<|im_start|>user\nRead.\n\n    indented body"
    assert tok.decode(r.prefix_ids) == "<|im_start|>user\nRead.\n\n"
    assert [tok.decode(q) for q in r.question_ids] == [
        "Q one?<|im_end|>\n<|im_start|>assistant\n",
        "Q two?<|im_end|>\n<|im_start|>assistant\n",
    ]
    assert prompt_text(tok, _sc("    indented body"), 1) == tok.decode(r.context_ids + r.question_ids[1])
    assert prompt_length(tok)(_sc("    indented body")) == len(r.context_ids) + len(r.question_ids[0])


def test_scbench_context_is_encoded_in_one_piece():
    """A BPE tokenizer can merge across the instruction/body seam; the official encodes the whole context
    prompt in one call, and so does kvbench (the protected prefix is the common part)."""
    tok = byte_tokenizer()
    calls = []
    original = tok.encode

    def spy(text, *a, **kw):
        calls.append(text)
        return original(text, *a, **kw)

    tok.encode = spy
    render(tok, _sc("body text"))
    assert "<|im_start|>user\nRead.\n\nbody text" in calls


def test_scbench_truncation_is_the_official_middle_cut_of_the_whole_context_prompt():
    tok = byte_tokenizer()
    body = "".join(chr(ord("a") + i % 26) for i in range(1000))
    full = render(tok, _sc(body))
    n = len(full.context_ids)
    limit = 700
    reserve = 101  # L = 599, L // 2 = 299: the official keeps 299 + 299 ids (one fewer than L when L is odd)
    r = render(tok, _sc(body, reserve=reserve), max_length=limit)
    assert r.truncated_from == n
    assert r.context_ids == full.context_ids[:299] + full.context_ids[-299:]
    assert r.prefix_ids == full.prefix_ids  # the head is in the first half, kept whole
    # L < 0 (the reserve exceeds the model limit): the official cuts nothing; L of 0 or 1 keeps nothing and
    # fails the official run's own check, so kvbench refuses it
    assert render(tok, _sc(body, reserve=limit + 5), max_length=limit).context_ids == full.context_ids
    with pytest.raises(KvbenchError, match="leaves no room"):
        render(tok, _sc(body, reserve=limit - 1), max_length=limit)


def test_scbench_without_chat_template_uses_the_plain_texts():
    tok = byte_tokenizer()
    tok.chat_template = None
    r = render(tok, _sc("body"))
    assert tok.decode(r.context_ids) == "Read.\n\nbody"
    assert [tok.decode(q) for q in r.question_ids] == ["Q one?", "Q two?"]
