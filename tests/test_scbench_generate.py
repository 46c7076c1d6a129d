"""Offline SCBench generation (kvbench.tasks.scbench_generate): schema, answers checked independently from the
context, determinism, sizing, the hub parquet round trip and the ``kvbench scbench generate`` command."""

from __future__ import annotations

import json
import random
import re
import statistics
from pathlib import Path

import pytest

from kvbench.errors import KvbenchError, TooShortError
from kvbench.tasks.scbench import build_context, iter_rows
from kvbench.tasks.scbench_generate import (
    GENERATED_TASKS,
    GENERATOR_VERSION,
    MF_KINDS,
    TURNS,
    generate_row,
    generate_rows,
    mf_answer,
    mf_kinds,
    write_hub_layout,
)
from tests.test_cli import kvbench

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "kvbench" / "builtin" / "tiny-trained"
NEW_TOKENS = 150  # a stand-in for the longest turn's max_new_tokens


def measure(row: dict) -> int:
    """Stand-in for the model's measure: a quarter of the characters of context and longest question, plus
    the answer's tokens (counts grow with the row like a tokenizer's)."""
    body = row["input"] if "input" in row and "context" not in row else row["context"]
    longest = max(len(t["input"]) for t in row["multi_turns"])
    return (len(str(body)) + longest) // 4 + NEW_TOKENS


def counting(m):
    """``m`` wrapped to count its calls: ``(counted, calls)``, one entry in ``calls`` per call."""
    calls = []

    def counted(row):
        calls.append(1)
        return m(row)

    return counted, calls


def rows_of(task: str, *, length: int = 2048, limit: int = 3, seed: int = 7, m=measure) -> list[dict]:
    return list(generate_rows(task, length=length, limit=limit, seed=seed, measure=m))


# --- schema and types --------------------------------------------------------------------------------------

SCHEMA = {
    "kv": {"id": int, "context": str, "multi_turns": list},
    "mf": {"id": int, "context": list, "multi_turns": list},
    "prefix_suffix": {"context": str, "multi_turns": list},
    "vt": {"index": int, "input": str, "length": int, "multi_turns": list},
}
ANSWER_TYPE = {"kv": str, "mf": int, "prefix_suffix": str, "vt": list}


def test_module_constants():
    assert GENERATED_TASKS == ("kv", "mf", "prefix_suffix", "vt")
    assert TURNS == 5 and isinstance(GENERATOR_VERSION, int) and GENERATOR_VERSION >= 1


@pytest.mark.parametrize("task", GENERATED_TASKS)
def test_rows_have_the_hub_fields_and_types(task):
    for i, row in enumerate(rows_of(task)):
        assert set(row) == set(SCHEMA[task]), row.keys()
        for field, kind in SCHEMA[task].items():
            assert type(row[field]) is kind, (field, type(row[field]))
        if task == "prefix_suffix":
            assert "id" not in row and "index" not in row
        else:
            assert row.get("id", row.get("index")) == i
        assert len(row["multi_turns"]) == TURNS
        for turn in row["multi_turns"]:
            assert set(turn) == {"input", "answer"}
            assert type(turn["input"]) is str and turn["input"]
            assert type(turn["answer"]) is ANSWER_TYPE[task]
        assert len({t["input"] for t in row["multi_turns"]}) == TURNS  # five different questions
        if task == "mf":
            assert all(type(x) is int for x in row["context"])
        if task == "vt":
            assert all(type(a) is str for t in row["multi_turns"] for a in t["answer"])
            assert row["length"] == measure(row)  # the row's measured tokens


# --- answers, computed independently from the context ------------------------------------------------------


def test_kv_answers_are_the_values_of_distinct_keys_in_the_json():
    for row in rows_of("kv"):
        assert row["context"].startswith("JSON data:\n")
        obj = json.loads(row["context"][len("JSON data:\n") :])
        assert len(obj) >= TURNS
        uuid_re = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
        assert all(uuid_re.fullmatch(k) and uuid_re.fullmatch(v) for k, v in obj.items())
        keys = []
        for turn in row["multi_turns"]:
            m = re.fullmatch(r'Key: "([^"]+)"\nThe value associated with the specified key is: ', turn["input"])
            assert m, turn["input"]
            keys.append(m.group(1))
            assert obj[m.group(1)] == turn["answer"]
        assert len(set(keys)) == TURNS
        order = sorted(list(obj).index(k) for k in keys)  # one key in each fifth of the object
        bounds = [j * len(obj) // TURNS for j in range(TURNS + 1)]
        assert all(bounds[j] <= pos < bounds[j + 1] for j, pos in enumerate(order)), (order, bounds)


def _mf_expected(values: list[int], target: str) -> int:
    ranked_desc = sorted(set(values), reverse=True)
    ranked_asc = sorted(set(values))
    table = {
        "the largest number of the list": max(values),
        "the second largest number of the list": ranked_desc[1],
        "the third largest number of the list": ranked_desc[2],
        "the smallest number of the list": min(values),
        "the second smallest number of the list": ranked_asc[1],
        "the third smallest number of the list": ranked_asc[2],
        "the median number of the list": statistics.median(values),
    }
    return table[target]


def test_mf_answer_by_hand():
    values = [5, 1, 9, 9, 3, 1, 7]  # distinct, descending: 9 7 5 3 1; sorted: 1 1 3 5 7 9 9
    expected = {"largest number": 9, "second largest number": 7, "third largest number": 5, "smallest number": 1,
                "second smallest number": 3, "third smallest number": 5, "median number": 5}  # fmt: skip
    assert {kind: mf_answer(values, kind) for kind in MF_KINDS} == expected


@pytest.mark.parametrize("length", [200, 2048])
def test_mf_answers_match_builtin_statistics_and_the_official_target_regex(length):
    for row in rows_of("mf", length=length, limit=12):
        values = row["context"]
        assert len(values) % 2 == 1 and all(0 <= x <= 99 for x in values)
        for turn in row["multi_turns"]:
            target = re.findall(r"The .+ is", turn["input"])[0].lower()[:-3]  # the official prompt code
            assert turn["input"].startswith("You should answer with only one number, no other words. The ")
            expected = _mf_expected(values, target)
            assert expected == int(expected) and turn["answer"] == expected, (target, turn["answer"], expected)


@pytest.mark.parametrize("seed", [0, 7, 42])
def test_mf_kinds_are_the_rows_question_kinds_at_every_length(seed):
    for length in (200, 2048):
        for index, row in enumerate(rows_of("mf", length=length, limit=4, seed=seed)):
            asked = [re.findall(r"The (.+) of the list is", t["input"])[0] for t in row["multi_turns"]]
            assert mf_kinds(seed, index) == asked
    with pytest.raises(KvbenchError, match="--seed -1"):
        mf_kinds(-1, 0)


def _resolve_vt(text: str) -> dict[str, int]:
    """Every variable's value, following the chains of assignments in order."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        m = re.fullmatch(r"VAR ([A-Z]+) = (\d+)", line.strip())
        if m:
            values[m.group(1)] = int(m.group(2))
            continue
        m = re.fullmatch(r"VAR ([A-Z]+) = VAR ([A-Z]+)", line.strip())
        if m:
            assert m.group(2) in values, f"{m.group(2)} used before it is assigned"
            values[m.group(1)] = values[m.group(2)]
    return values


def test_vt_answers_are_the_variables_holding_each_value():
    for row in rows_of("vt"):
        assert row["input"].startswith("Memorize and track the chain(s) of variable assignment")
        values = _resolve_vt(row["input"])
        asked = []
        for turn in row["multi_turns"]:
            m = re.match(
                r"Question: Find all variables that are assigned the value (\d+) in the text above\.", turn["input"]
            )
            assert m, turn["input"]
            value = int(m.group(1))
            asked.append(value)
            holders = sorted(v for v, x in values.items() if x == value)
            assert sorted(turn["answer"]) == holders and len(holders) == 5
            assert turn["input"].endswith(f"5 variables are assigned the value {value}, they are: ")
        assert len(set(asked)) == TURNS  # each turn tracks a different value


def test_prefix_suffix_answer_is_the_unique_string_with_that_prefix_and_suffix():
    for row in rows_of("prefix_suffix", limit=4):
        head, _, listing = row["context"].partition("\n")
        assert head == "There is a list of strings:"
        strings = listing.split("\n")
        for turn in row["multi_turns"]:
            m = re.fullmatch(r'What is the string that starts with "(.+)" and ends with "(.+)"\?', turn["input"])
            assert m, turn["input"]
            prefix, suffix = m.groups()
            hits = [s for s in strings if s.startswith(prefix) and s.endswith(suffix)]
            assert hits == [turn["answer"]]
            # distractors: other strings share the prefix or the suffix alone
            assert sum(s.startswith(prefix) for s in strings) >= 3
            assert sum(s.endswith(suffix) for s in strings) >= 3


# --- determinism and independence -------------------------------------------------------------------------


@pytest.mark.parametrize("task", GENERATED_TASKS)
def test_same_seed_same_rows_other_seed_other_rows_global_random_unused(task):
    random.seed(1)
    a = rows_of(task, limit=2)
    random.seed(2)
    b = rows_of(task, limit=2)
    assert a == b
    c = rows_of(task, limit=2, seed=8)
    assert all(x["multi_turns"] != y["multi_turns"] for x, y in zip(a, c, strict=True))
    assert a[0]["multi_turns"] != a[1]["multi_turns"]  # rows differ from each other too


@pytest.mark.parametrize("task", GENERATED_TASKS)
def test_row_does_not_depend_on_limit(task):
    short, long = rows_of(task, limit=2), rows_of(task, limit=4)
    assert long[:2] == short
    assert generate_row(task, 3, length=2048, seed=7, measure=measure) == long[3]


# --- sizing --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", GENERATED_TASKS)
@pytest.mark.parametrize("length", [700, 2048, 8192])
def test_rows_fit_the_length_and_come_near_it_with_few_measure_calls(task, length):
    counted, calls = counting(measure)
    rows = rows_of(task, length=length, limit=3, m=counted)
    for row in rows:
        assert 0.9 * length <= measure(row) <= length, (task, length, measure(row))
    assert len(calls) / len(rows) <= 12  # a search, not a scan
    bigger = rows_of(task, length=2 * length, limit=1)[0]
    assert measure(bigger) > 1.5 * measure(rows[0])  # the size follows the length


@pytest.mark.parametrize("task", GENERATED_TASKS)
def test_too_short_names_the_length_that_fits(task):
    with pytest.raises(TooShortError) as info:
        rows_of(task, length=100, limit=1)
    need = int(re.search(r"--length >= (\d+)", str(info.value)).group(1))
    assert need > 100
    row = rows_of(task, length=need, limit=1)[0]  # the named length is enough
    assert measure(row) <= need


def test_bad_arguments_raise_at_the_call():
    with pytest.raises(KvbenchError, match="generates kv, mf, prefix_suffix, vt"):
        generate_rows("qa_eng", length=2048, limit=1, seed=0, measure=measure)
    with pytest.raises(KvbenchError, match="--seed"):
        generate_rows("kv", length=2048, limit=1, seed=-1, measure=measure)
    with pytest.raises(KvbenchError, match="--seed"):
        generate_rows("kv", length=2048, limit=1, seed=2**32, measure=measure)
    with pytest.raises(KvbenchError, match="--limit"):
        generate_rows("kv", length=2048, limit=-1, seed=0, measure=measure)


# --- hub layout, read back --------------------------------------------------------------------------------

PARQUET_TYPES = {
    "kv": {"id": "int64", "context": "string", "multi_turns": "list<element: struct<answer: string, input: string>>"},
    "mf": {
        "id": "int64",
        "context": "list<element: int64>",
        "multi_turns": "list<element: struct<answer: int64, input: string>>",
    },
    "prefix_suffix": {"context": "string", "multi_turns": "list<element: struct<answer: string, input: string>>"},
    "vt": {
        "index": "int64",
        "input": "string",
        "length": "int64",
        "multi_turns": "list<element: struct<answer: list<element: string>, input: string>>",
    },
}


@pytest.mark.parametrize("task", GENERATED_TASKS)
def test_parquet_round_trip_and_build_context(tmp_path, task):
    import pyarrow.parquet as pq

    rows = rows_of(task, limit=10)  # more than one write batch
    path = write_hub_layout(task, iter(rows), tmp_path)
    assert path == tmp_path / f"scbench_{task}" / "test-00000-of-00001.parquet"
    schema = pq.read_schema(path)
    assert {f.name: str(f.type) for f in schema} == PARQUET_TYPES[task]
    back = list(iter_rows([path]))
    assert back == rows
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temp file left
    for i, row in enumerate(back):
        ctx = build_context(task, i, row, needles=None)
        assert len(ctx.questions) == TURNS
        assert [q.references for q in ctx.questions][0]


def test_write_is_atomic_an_error_leaves_the_old_file(tmp_path):
    rows = rows_of("kv", limit=2)
    path = write_hub_layout("kv", rows, tmp_path)
    before = path.read_bytes()

    def broken():
        yield rows[0]
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_hub_layout("kv", broken(), tmp_path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]

    def failing():
        raise RuntimeError("before any row")
        yield  # a generator

    with pytest.raises(RuntimeError):
        write_hub_layout("mf", failing(), tmp_path / "new")
    assert not (tmp_path / "new").exists()  # a folder it created is removed again


# --- with the built-in model's tokenizer -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY))


@pytest.mark.parametrize("task", GENERATED_TASKS)
def test_rows_fit_4096_with_the_tiny_tokenizer(tiny_tokenizer, task):
    from kvbench.tasks.scbench import row_measure

    real = row_measure(tiny_tokenizer, task)
    for row in rows_of(task, length=4096, limit=2, m=real):
        tokens = real(row)
        assert 0.9 * 4096 <= tokens <= 4096, tokens
        build_context(task, 0, row, needles=None)


# --- command line --------------------------------------------------------------------------------------------


def test_cli_writes_the_hub_layout(tmp_path, capsys):
    out = tmp_path / "data" / "scbench"
    code = kvbench("scbench", "generate", "--task", "mf,vt", "--length", "1024", "--limit", "2", "--seed", "3",
                   "--out", str(out))  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for task in ("mf", "vt"):
        path = out / f"scbench_{task}" / "test-00000-of-00001.parquet"
        assert f"{path}: 2 rows" in captured.out
        rows = list(iter_rows([path]))
        assert len(rows) == 2 and all(build_context(task, i, r) for i, r in enumerate(rows))
    assert sorted(p.name for p in out.iterdir()) == ["scbench_mf", "scbench_vt"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "kv,qa_eng", "--length", "1024"], "--task qa_eng"),
        (["--task", "mf,kv", "--length", "40"], "too short"),
        (["--task", "kv", "--limit", "0"], "--limit 0"),
        (["--task", "kv", "--seed", "-5"], "--seed -5"),
        (["--task", "kv", "--length", "0"], "--length 0"),
        (["--task", "kv,kv"], "each once"),
        (["--task", "kv", "--model", "no-such-model"], "--model no-such-model"),
    ],
)
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    code = kvbench("scbench", "generate", *args, "--out", str(out))
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()
