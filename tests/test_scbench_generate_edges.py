"""Edges of offline SCBench generation (kvbench.tasks.scbench_generate) that the main tests do not reach:
``kv_row``, the rows pinned by ``GENERATOR_VERSION``, the fifths of ``_spread``, prefix_suffix's uniqueness
repair on colliding strings, the too-short message's size, argument checks and the parquet writer's edges."""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import random
import re
import string

import pytest

from kvbench.errors import KvbenchError, TooShortError
from kvbench.tasks import scbench_generate as gen
from kvbench.tasks.ruler_data import NOISE
from kvbench.tasks.scbench import iter_rows
from tests.test_scbench_generate import counting, measure


def _pairs(row: dict) -> list[tuple[str, str]]:
    return list(json.loads(row["context"].removeprefix("JSON data:\n")).items())


def n_pairs(row: dict) -> int:
    return len(_pairs(row))


# --- kv_row --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pairs", [5, 23])
def test_kv_row_is_the_generated_row_at_that_many_pairs(pairs):
    """A measure counting pairs makes ``generate_row``'s sizing land on exactly ``pairs``."""
    row = gen.kv_row(7, 2, pairs)
    assert n_pairs(row) == pairs
    assert row == gen.generate_row("kv", 2, length=pairs, seed=7, measure=n_pairs)


def test_kv_row_asks_the_positions_it_is_told_even_below_one_per_fifth():
    row = gen.kv_row(7, 1, 3, ask=[2, 0, 2])
    assert set(row) == {"id", "context", "multi_turns"} and row["id"] == 1
    items = _pairs(row)
    assert items == _pairs(gen.kv_row(7, 1, 5))[:3]  # the generator's first three pairs
    assert row["multi_turns"] == [
        {"answer": items[j][1], "input": f'Key: "{items[j][0]}"\nThe value associated with the specified key is: '}
        for j in (2, 0, 2)
    ]
    one = gen.kv_row(7, 1, 1, ask=[0])  # one pair is enough when the question is given
    assert n_pairs(one) == 1 and one["multi_turns"][0]["answer"] == items[0][1]


@pytest.mark.parametrize(
    "pairs, ask, message",
    [
        (4, None, "scbench/kv: 4 pairs; give at least 5 (one per question without ask)"),
        (0, [0], "scbench/kv: 0 pairs; give at least 1"),
        (True, [0], "scbench/kv: True pairs"),
        (2.5, None, "scbench/kv: 2.5 pairs"),
        (3, [], "scbench/kv: ask positions [] must be a non-empty list within 0..2"),
        (3, [0, 3], "scbench/kv: ask positions [0, 3] must be a non-empty list within 0..2"),
        (3, [-1], "scbench/kv: ask positions [-1] must be a non-empty list within 0..2"),
    ],
)
def test_kv_row_refuses_bad_sizes_and_positions(pairs, ask, message):
    with pytest.raises(KvbenchError) as info:
        gen.kv_row(7, 0, pairs, ask)
    assert str(info.value).startswith(message), str(info.value)


def test_kv_row_checks_the_seed():
    with pytest.raises(KvbenchError, match=r"^--seed -1: give an integer from 0 to 4294967295$"):
        gen.kv_row(-1, 0, 5)


# --- rows pinned by GENERATOR_VERSION --------------------------------------------------------------------------

#: sha256 (first 16 hex digits) of ``json.dumps(rows, sort_keys=True)`` for rows 0-1 at length 700, seed 0, with
#: the stand-in measure, as generator version 1 makes them. Generated rows are cached under a key holding
#: GENERATOR_VERSION (``SCBenchBench._generated``), so rows must not change within a version: a change of the
#: construction or its seeding must bump GENERATOR_VERSION and these digests together. Row 1 of mf repeats one
#: of its first three numbers as its fourth (only the first three are drawn distinct).
PINNED = {
    1: {
        "kv": "be689c265d376c37",
        "mf": "7bf78d286abe91cb",
        "prefix_suffix": "2e9dc47a1b53ca79",
        "vt": "14c8ec6db54e93c5",
    }
}


@pytest.mark.parametrize("task", gen.GENERATED_TASKS)
def test_rows_are_pinned_by_the_generator_version(task):
    rows = list(gen.generate_rows(task, length=700, limit=2, seed=0, measure=measure))
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]
    assert digest == PINNED[gen.GENERATOR_VERSION][task]
    if task == "mf":
        values = rows[1]["context"]
        assert len(set(values[:3])) == 3 and values[3] in values[:3]


def test_mf_bounds_are_drawn_from_0_19_and_79_99():
    """Rows 0-31 of seed 0 include rows whose bound draws reject 20 (rows 20, 28) and 100 (rows 5, 12, 20); with
    501 numbers a row's minimum and maximum are its bounds or next to them, never outside the documented ranges."""
    for i in range(32):
        values = gen.generate_row("mf", i, length=501, seed=0, measure=lambda r: len(r["context"]))["context"]
        assert len(values) == 501
        assert 0 <= min(values) <= 19 and 79 <= max(values) <= 99, (i, min(values), max(values))


# --- placement and strings ---------------------------------------------------------------------------------


def test_spread_puts_one_position_at_its_fraction_of_each_fifth():
    """Fifths of range(10): [0,2) [2,4) [4,6) [6,8) [8,10); of range(12): [0,2) [2,4) [4,7) [7,9) [9,12)."""
    assert gen._spread([0.0, 0.5, 0.25, 0.99, 0.5], 10) == [0, 3, 4, 7, 9]
    assert gen._spread([0.5] * 5, 12) == [1, 3, 5, 8, 10]


def test_bump_replaces_the_last_character_by_the_next_one_cyclically():
    """The alphabet is a-z, A-Z, 0-9 in that order."""
    bump = gen._PrefixSuffix._bump
    assert [bump("abc"), bump("abz"), bump("xyZ"), bump("ab9")] == ["abd", "abA", "xy0", "aba"]


def _check_prefix_suffix(row: dict) -> list[str]:
    """Every asked (prefix, suffix) is a 4-character pair matching exactly the answer; returns the strings."""
    strings = row["context"].removeprefix("There is a list of strings:\n").split("\n")
    assert all(12 <= len(s) <= 20 and set(s) <= set(string.ascii_letters + string.digits) for s in strings)
    asked = set()
    for turn in row["multi_turns"]:
        prefix, suffix = re.fullmatch(r'What is the string that starts with "(.+)" and ends with "(.+)"\?',
                                      turn["input"]).groups()  # fmt: skip
        assert len(prefix) == len(suffix) == 4
        assert [s for s in strings if s.startswith(prefix) and s.endswith(suffix)] == [turn["answer"]]
        asked.add((prefix, suffix))
    assert len(asked) == gen.TURNS
    return strings


def test_prefix_suffix_strings_keep_their_lengths_and_affixes_are_four_characters():
    for row in gen.generate_rows("prefix_suffix", length=2048, limit=3, seed=7, measure=measure):
        _check_prefix_suffix(row)


def test_prefix_suffix_repairs_colliding_strings_so_each_question_has_one_answer():
    """With every drawn string the same, targets and other strings collide; bumping makes each asked pair unique
    without changing any string's length."""
    size = 40
    g = gen._PrefixSuffix("prefix_suffix", 0, 0)
    g._strings = ["abcdefghijkl"] * size
    row = g.build(size)
    strings = _check_prefix_suffix(row)
    assert len(strings) == size
    assert sum(s == "abcdefghijkl" for s in strings) == 1  # the rest were bumped or rewritten


def test_vt_turn_is_rulers_question_then_its_answer_prefix():
    for row in gen.generate_rows("vt", length=1024, limit=2, seed=3, measure=measure):
        for turn in row["multi_turns"]:
            value = re.search(r"value (\d+) ", turn["input"]).group(1)
            assert turn["input"] == (
                f"Question: Find all variables that are assigned the value {value} in the text above. Answer: "
                "According to the chain(s) of variable assignment in the text above, 5 variables are assigned the "
                f"value {value}, they are: "
            )


# --- sizing message and argument checks ----------------------------------------------------------------------

SIZE = {  # the size a row names in messages, counted from the row itself
    "kv": lambda r: f"{n_pairs(r)} key-value pairs",
    "mf": lambda r: f"{len(r['context'])} numbers",
    "prefix_suffix": lambda r: f"{r['context'].count(chr(10))} strings",
    "vt": lambda r: f"{r['input'].split(chr(10)).count(NOISE)} noise lines",
}


@pytest.mark.parametrize("task", gen.GENERATED_TASKS)
def test_too_short_names_the_smallest_rows_size_as_counted_in_it(task):
    seen = []

    def huge(row):
        seen.append(row)
        return 10_000

    with pytest.raises(TooShortError) as info:
        gen.generate_row(task, 3, length=500, seed=1, measure=huge)
    assert len(seen) == 1
    assert f"its smallest generated row ({SIZE[task](seen[0])}, row 3) already needs 10000 tokens" in str(info.value)
    assert str(info.value).endswith("use --length >= 10000")


def test_a_tiny_length_still_searches_past_eight_units_per_token():
    """At 4 pairs a token, length 2 fits 11 pairs (11 // 4 == 2): above 8 units per token of the length (16),
    the search may still go as far as the smallest row plus 64 units."""
    row = gen.generate_row("kv", 0, length=2, seed=0, measure=lambda r: n_pairs(r) // 4)
    assert n_pairs(row) == 11


def test_generate_rows_limit_zero_gives_none_and_a_negative_limit_is_refused():
    assert list(gen.generate_rows("kv", length=2048, limit=0, seed=0, measure=measure)) == []
    with pytest.raises(KvbenchError, match=r"^--limit -1: give the number of rows, a whole number \(0 gives none\)$"):
        gen.generate_rows("kv", length=2048, limit=-1, seed=0, measure=measure)


@pytest.mark.parametrize("limit", [True, 2.5, "3"])
def test_generate_rows_refuses_a_non_integer_limit_at_the_call(limit):
    with pytest.raises(KvbenchError, match=r"^--limit "):
        gen.generate_rows("kv", length=2048, limit=limit, seed=0, measure=measure)


def test_hub_schema_of_an_unknown_task_names_the_tasks():
    with pytest.raises(KvbenchError) as info:
        gen.hub_schema("qa_eng")
    assert str(info.value) == "scbench task 'qa_eng' has no generated layout; tasks: kv, mf, prefix_suffix, vt"


# --- parquet writer edges --------------------------------------------------------------------------------------


def test_write_zero_rows_gives_an_empty_file_with_the_hub_schema(tmp_path):
    import pyarrow.parquet as pq

    path = gen.write_hub_layout("kv", iter([]), tmp_path)
    assert pq.read_schema(path) == gen.hub_schema("kv")
    assert list(iter_rows([path])) == []


def test_write_takes_columns_by_name_not_by_the_rows_key_order(tmp_path):
    """Nine rows: one full batch of eight and a last batch of one, each row's keys in reverse order."""
    rows = list(gen.generate_rows("mf", length=300, limit=9, seed=5, measure=measure))
    shuffled = [dict(reversed(row.items())) for row in rows]
    path = gen.write_hub_layout("mf", shuffled, tmp_path)
    assert list(iter_rows([path])) == rows


def test_write_error_keeps_a_created_folder_that_is_no_longer_empty_and_raises(tmp_path):
    out = tmp_path / "new"

    def rows():
        (out / "keep.txt").write_text("someone else's file")
        raise RuntimeError("boom")
        yield  # a generator

    with pytest.raises(RuntimeError, match="boom"):
        gen.write_hub_layout("kv", rows(), out)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]  # scbench_kv/ removed, out/ kept


# --- the size search (_fit): its result, its cap, its argument checks -------------------------------------------


def _largest_by_brute_force(task: str, index: int, length: int, m) -> dict:
    """The row at the largest size whose measure fits ``length``: every size from the smallest up, one by one."""
    g = gen._GENERATORS[task](task, 3, index)
    size, fits = g.n_min, None
    while m(row := g.build(size)) <= length:
        fits, size = (row, m(row)), size + 1
    assert fits is not None
    return g.finish(*fits)


def _convex(row: dict) -> int:
    """A measure that grows faster than the row (as a prompt with a growing per-unit cost would)."""
    return measure(row) ** 2 // 400


@pytest.mark.parametrize("task", gen.GENERATED_TASKS)
@pytest.mark.parametrize("length, m", [(500, measure), (701, measure), (650, _convex)])
def test_the_search_finds_the_largest_row_that_fits(task, length, m):
    row = gen.generate_row(task, 1, length=length, seed=3, measure=m)
    assert row == _largest_by_brute_force(task, 1, length, m)


def test_a_measure_that_does_not_grow_is_refused_above_eight_units_per_token():
    """kv from 5 pairs: 18, 36, 72 pairs fit (72 is the cap 8 x 9 itself); the next guess, 144, is above it."""
    with pytest.raises(KvbenchError) as info:
        gen.generate_row("kv", 0, length=9, seed=0, measure=lambda row: 0)
    assert str(info.value) == (
        "scbench/kv: a row of 144 key-value pairs still measures 0 <= 9 tokens; the measure does not grow with the "
        "row (check the tokenizer / measure function)"
    )


@pytest.mark.parametrize("index", [True, -1, 1.0, "2"])
def test_generate_row_refuses_a_row_index_that_is_not_a_whole_number(index):
    with pytest.raises(KvbenchError) as info:
        gen.generate_row("mf", index, length=700, seed=0, measure=measure)
    assert str(info.value) == f"scbench/mf: row index {index!r} must be a non-negative integer"


@pytest.mark.parametrize("seed", [True, -1, 2**32, 1.0])
def test_generate_row_refuses_a_seed_outside_the_range(seed):
    with pytest.raises(KvbenchError) as info:
        gen.generate_row("vt", 0, length=700, seed=seed, measure=measure)
    assert str(info.value) == f"--seed {seed!r}: give an integer from 0 to 4294967295"


class _Sized(gen._Gen):
    """A generator whose row is its size alone, to search many lengths and measures in little time."""

    n_min = 3

    def build(self, size: int) -> dict:
        return {"size": size}


def _uneven_measure(seed: int):
    """A non-decreasing measure with uneven steps (flat runs, 1-2 token steps, jumps of 7 and 30)."""
    rng = random.Random(seed)
    tokens = list(itertools.accumulate(rng.choice([0, 1, 1, 2, 7, 30]) for _ in range(4000)))
    return lambda row: tokens[row["size"]]


@pytest.mark.parametrize(
    "m", [_uneven_measure(1), _uneven_measure(2), lambda r: 4 * r["size"] + 10, lambda r: r["size"] ** 2 // 9]
)
def test_the_search_finds_the_largest_fitting_size_at_every_length(m):
    """Against a scan of every size, at every length from the smallest row's measure to 3,000 tokens."""
    g = _Sized("kv", 0, 0)
    tokens = [m(g.build(n)) for n in range(4000)]  # non-decreasing in the size
    for length in range(tokens[g.n_min], 3000):
        largest = bisect.bisect_right(tokens, length) - 1
        assert gen._fit(g, m, length) == {"size": largest}, length


def test_the_search_measures_five_to_eight_rows_as_documented():
    """The module docstring's cost: about five to eight ``measure`` calls a row. Real rows at 1k-4k tokens take
    5-8 each; a linear measure is closed in at most 7 at every length, an uneven one in at most 10 on average."""
    for task in gen.GENERATED_TASKS:
        for length in (1024, 2048, 4096):
            counted, calls = counting(measure)
            gen.generate_row(task, 0, length=length, seed=0, measure=counted)
            assert 5 <= len(calls) <= 8, (task, length, len(calls))
    g = _Sized("kv", 0, 0)
    for m, most, mean in [(lambda r: 4 * r["size"] + 10, 7, 7), (_uneven_measure(1), 15, 10)]:
        counts = []
        for length in range(m(g.build(g.n_min)), 3000, 3):
            counted, calls = counting(m)
            gen._fit(g, counted, length)
            counts.append(len(calls))
        assert max(counts) <= most and sum(counts) / len(counts) <= mean
