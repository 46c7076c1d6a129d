"""Smaller SCBench rows for training curricula: ``generate_row(..., turns=, distractors=)`` for prefix_suffix and
vt, and the training-only row kinds built on them (``scbench_ps_short``, ``scbench_ps_hard``,
``scbench_vt_short``, :data:`kvbench_training.data.SCBENCH_SHORT`). Answers are checked against the context
independently: the strings matching the asked prefix and suffix, the variables a chain assigns."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest

import kvbench_training as T
from kvbench.errors import KvbenchError
from kvbench.tasks.scbench_generate import PS_DISTRACTORS, TURNS, generate_row
from kvbench_training import data as D
from tests.test_scbench_generate import _resolve_vt, measure

ROOT = Path(__file__).resolve().parents[1]
PS_QUESTION = r'What is the string that starts with "(.+)" and ends with "(.+)"\?'


@lru_cache(maxsize=1)
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ROOT / "kvbench" / "builtin" / "tiny-trained")


def _ps_hits(strings: list[str], question: str) -> tuple[list[str], int, int]:
    """(strings with the asked prefix and suffix, strings with the prefix, strings with the suffix)."""
    prefix, suffix = re.fullmatch(PS_QUESTION, question).groups()
    hits = [s for s in strings if s.startswith(prefix) and s.endswith(suffix)]
    return hits, sum(s.startswith(prefix) for s in strings), sum(s.endswith(suffix) for s in strings)


@pytest.mark.parametrize("distractors", range(PS_DISTRACTORS + 1))
@pytest.mark.parametrize("turns", [1, 3, TURNS])
def test_smaller_prefix_suffix_rows_ask_unique_strings_with_the_asked_distractors(turns, distractors):
    for seed in (7, 8):
        row = generate_row(
            "prefix_suffix", 0, length=400, seed=seed, measure=measure, turns=turns, distractors=distractors
        )
        strings = row["context"].removeprefix("There is a list of strings:\n").split("\n")
        assert len(row["multi_turns"]) == turns and len(strings) >= turns * (1 + 2 * distractors)
        for turn in row["multi_turns"]:
            hits, with_prefix, with_suffix = _ps_hits(strings, turn["input"])
            assert hits == [turn["answer"]]
            assert with_prefix == with_suffix == 1 + distractors


def test_smaller_vt_rows_ask_the_first_chains_of_the_full_row():
    full = generate_row("vt", 0, length=2048, seed=7, measure=measure)
    for turns in range(1, TURNS + 1):
        row = generate_row("vt", 0, length=2048, seed=7, measure=measure, turns=turns)
        assert [t["input"] for t in row["multi_turns"]] == [t["input"] for t in full["multi_turns"][:turns]]
        values = _resolve_vt(row["input"])
        for turn in row["multi_turns"]:
            value = int(re.search(r"assigned the value (\d+) in the text", turn["input"]).group(1))
            assert sorted(turn["answer"]) == sorted(v for v, x in values.items() if x == value)
        assert len(values) == 5 * turns  # no other chain in the text


def test_the_defaults_are_the_evaluation_rows():
    for task in ("prefix_suffix", "vt"):
        explicit = generate_row(task, 1, length=1500, seed=42, measure=measure, turns=TURNS, distractors=PS_DISTRACTORS)
        assert explicit == generate_row(task, 1, length=1500, seed=42, measure=measure)


@pytest.mark.parametrize(
    "task,kw,message",
    [
        ("kv", {"turns": 3}, "smaller rows are for prefix_suffix"),
        ("mf", {"distractors": 0}, "smaller rows are for prefix_suffix"),
        ("prefix_suffix", {"turns": 0}, "turns 1-5"),
        ("prefix_suffix", {"turns": TURNS + 1}, "turns 1-5"),
        ("prefix_suffix", {"distractors": 3}, "distractors 0-2"),
        ("vt", {"turns": 2, "distractors": 1}, "vt has no distractors"),
    ],
)
def test_bad_smaller_rows_are_refused_naming_the_range(task, kw, message):
    with pytest.raises(KvbenchError, match=message):
        generate_row(task, 0, length=2048, seed=7, measure=measure, **kw)


def _supervised_spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    spans, run = [], []
    for token, m in zip(ids, mask, strict=True):
        if m:
            run.append(token)
        elif run:
            spans.append(run)
            run = []
    return spans + ([run] if run else [])


@pytest.mark.parametrize("task", sorted(D.SCBENCH_SHORT))
@pytest.mark.parametrize("length", [384, 768])
def test_short_rows_fit_and_supervise_one_answer_per_question(task, length):
    tok = tokenizer()
    name, fewest, most = D.SCBENCH_SHORT[task]
    seen_distractors, seen_turns = set(), set()
    for ex_seed in range(T.TRAIN_SEED_BASE, T.TRAIN_SEED_BASE + 8):
        ids, mask, refs = D.short_scbench_row(task, ex_seed, length, tok)
        assert len(ids) == len(mask) <= length and 1 <= len(refs) <= TURNS
        seen_turns.add(len(refs))
        # each question's supervised span is its answer then <|im_end|>, nothing else
        spans = _supervised_spans(ids, mask)
        assert [tok.decode(s[:-1]) for s in spans] == list(refs) and all(s[-1] == tok.eos_token_id for s in spans)
        text = tok.decode(ids)
        if name == "prefix_suffix":
            listing = text.split("There is a list of strings:\n", 1)[1].split("What is the string", 1)[0]
            strings = listing.split("\n")
            questions = re.findall(r'What is the string that starts with "[^"]+" and ends with "[^"]+"\?', text)
            assert len(questions) == len(refs)
            counts = set()
            for question, ref in zip(questions, refs, strict=True):
                hits, with_prefix, with_suffix = _ps_hits(strings, question)
                assert hits == [ref] and " " not in ref and "," not in ref  # one string, never a list
                counts |= {with_prefix - 1, with_suffix - 1}
            assert len(counts) == 1 and fewest <= min(counts) <= most
            seen_distractors |= counts
        else:
            values = _resolve_vt(text.split("<|im_start|>user\n", 1)[1].split("Question:", 1)[0])
            asked = [int(v) for v in re.findall(r"are assigned the value (\d+), they are: ", text)]
            assert len(asked) == len(refs)
            for value, ref in zip(asked, refs, strict=True):
                assert sorted(ref.split()) == sorted(v for v, x in values.items() if x == value)
    assert len(seen_turns) > 1 or length == 384  # short rows hold few questions; longer ones vary
    if name == "prefix_suffix":
        assert seen_distractors == set(range(fewest, most + 1))


def test_short_rows_are_training_tasks_and_fall_back_when_nothing_fits():
    tok = tokenizer()
    assert set(D.SCBENCH_SHORT) <= set(T.KNOWN_TASKS)
    T.parse_mix("scbench_ps_short=0.4,scbench_ps_hard=0.3,scbench_vt_short=0.3")
    assert D.short_scbench_row("scbench_vt_short", T.TRAIN_SEED_BASE, 100, tok) is None
    example = T.training_example(D.row_rng(1, 0, 0), 120, tok, (("scbench_vt_short", 1.0),))
    assert example.task == "recall"  # a short row that cannot fit falls back as a RULER task does
