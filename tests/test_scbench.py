"""The ``scbench`` bench: loading (jsonl and parquet layouts, hub opt-in, missing data), field types,
prompts, the repoqa needle pool, and each fixture row through loader -> questions -> scorers."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvbench.errors import KvbenchError
from kvbench.scorers import get_scorer, list_scorers
from kvbench.scorers.scbench_repoqa import parse_repoqa_references
from kvbench.tasks import Context, get_bench, list_benches
from kvbench.tasks import scbench as sb
from kvbench.tasks.scbench_generate import GENERATED_TASKS, hub_schema

FIXTURES = Path(__file__).parent / "fixtures"  # holds scbench/scbench_<task>/test-00000-of-00001.parquet
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"  # real data for integration, if present


def fixture_file(task: str) -> Path:
    return FIXTURES / "scbench" / f"scbench_{task}" / "test-00000-of-00001.parquet"


def rows(task: str) -> list[dict]:
    """The fixture rows of ``task`` as the hub's parquet gives them (read with pyarrow, not the loader)."""
    return pq.read_table(fixture_file(task)).to_pylist()


def load(task: str, data_dir=FIXTURES, limit: int = 10, **kw) -> list[Context]:
    bench = sb.SCBenchBench(data_dir=data_dir, **kw)
    return list(bench.contexts(task, length=0, limit=limit, seed=0, prompt_length=None))


def write_jsonl(path: Path, items: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in items), encoding="utf-8")


def write_parquet(path: Path, items: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(items), path)


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("KVBENCH_DATA_DIR", raising=False)
    monkeypatch.delenv(sb.HUB_ENV, raising=False)


# --- registration, tasks -----------------------------------------------------------------------------------


def test_registered_with_twelve_tasks_in_official_order():
    assert "scbench" in list_benches()
    bench = get_bench("scbench")
    assert isinstance(bench, sb.SCBenchBench)
    assert bench.tasks() == [
        "kv", "prefix_suffix", "vt", "repoqa", "qa_eng", "qa_chn", "choice_eng", "many_shot", "summary", "mf",
        "summary_with_needles", "repoqa_and_kv",
    ]  # fmt: skip
    assert set(bench.tasks()) == set(sb.MAX_NEW_TOKENS)


def test_unknown_task_raises_at_once():
    with pytest.raises(ValueError, match="valid tasks"):
        sb.SCBenchBench(data_dir=FIXTURES).contexts("nope", length=0, limit=1, seed=0, prompt_length=None)


# --- every fixture row, end to end -------------------------------------------------------------------------

#: task -> one scripted prediction per turn, with the expected (official, revised) score of each.
SCRIPTED = {
    "kv": [("b8e2d4f6-1a3c-4e5f-8a7b-9c0d1e2f3a4b", 100, 100), ("9F8E7D6C-5B4A-4392-8F1E-0D9C8B7A6F5E", 0, 0)],
    "prefix_suffix": [("abNcDeFgHxyz", 100, 100), ("mnOpQrStUvWy", 0, 0)],
    "vt": [("QXHVE, ZLPRA", 67, 67), ("BDOEY", 100, 100)],
    "repoqa": [("```python\n{0}\n```", 100, 100), ("```python\n{0}\n```", 0, 0)],  # see _prediction
    "qa_eng": [("The Wren.", 100, 100), ("92", 0, 0)],
    "qa_chn": [("北", 100, 40), ("杭州", 100 * 2 / 3, 100)],
    "choice_eng": [("Based on the text, the lighthouse stood on Gull Rock.", 100, 0), ("(C)", 0, 100)],
    "many_shot": [("(A)", 100, 100), ("(A)", 100, 100)],  # official char loop: "(" matches "(B)"
    # rougeLsum: 5 of the 19 reference tokens, in order: P=1, R=5/19, F=10/24. None: the reference itself
    "summary": [("The paper digitises 120 ledgers.", 1000 / 24, 1000 / 24), (None, 100, 100)],
    "mf": [("88", 100, 100), ("3", 0, 0)],
    "summary_with_needles": [(None, 100, 100), ("The pass key is 71432.", 100, 100)],
    "repoqa_and_kv": [("```python\n{0}\n```", 100, 100), ("feedface-8888-4999-aaaa-bbbbccccdddd", 0, 100)],
}


def _prediction(task: str, j: int, ctx: Context, template):
    q = ctx.questions[j]
    if template is None:
        return q.references[0]
    if task == "repoqa":  # turn 0: its own function; turn 1: the other needle (clamp) instead of running_mean
        _, _, _, needles = parse_repoqa_references(q.references)
        return template.format(dict(needles)["clamp"])
    if task == "repoqa_and_kv" and j == 0:
        return template.format(q.references[0])
    return template


@pytest.mark.parametrize("task", sb.TASKS)
def test_fixture_row_end_to_end(task):
    (ctx,) = load(task)
    assert (ctx.bench, ctx.task, ctx.item) == ("scbench", task, "0")
    assert ctx.body and ctx.meta["row"] == 0
    # the hub's vt and prefix_suffix rows have no id (vt: index, input, length)
    assert ctx.meta.get("id") == (None if task in ("vt", "prefix_suffix") else 0) == rows(task)[0].get("id")
    assert ctx.meta["n_turns"] == len(ctx.questions) == len(rows(task)[0]["multi_turns"])
    assert [q.qid for q in ctx.questions] == [str(j) for j in range(len(ctx.questions))]
    registered = set(list_scorers())
    for j, (template, official, revised) in enumerate(SCRIPTED[task]):
        q = ctx.questions[j]
        assert q.answer_prefix == ""
        assert len(q.scorers) == 2 and set(q.scorers) <= registered
        assert q.scorers[1] == q.scorers[0] + "_revised"
        pred = _prediction(task, j, ctx, template)
        got = tuple(get_scorer(name)(pred, q.references) for name in q.scorers)
        assert got == pytest.approx((official, revised)), (task, j, pred)


def test_generation_lengths_and_subtask_scorers():
    expect = {"kv": 150, "prefix_suffix": 150, "vt": 30, "repoqa": 1024, "qa_eng": 40, "qa_chn": 40,
              "choice_eng": 40, "many_shot": 10, "summary": 200, "mf": 5}  # fmt: skip
    for task, n in expect.items():
        assert {q.max_new_tokens for q in load(task)[0].questions} == {n}
        assert {q.scorers for q in load(task)[0].questions} == {(f"scbench_{task}", f"scbench_{task}_revised")}
    (swn,) = load("summary_with_needles")
    assert [(q.max_new_tokens, q.scorers[0]) for q in swn.questions] == [
        (800, "scbench_summary_with_needles_summary"),
        (15, "scbench_summary_with_needles_passkey"),
    ]
    assert swn.meta["subtasks"] == ["scbench_summary", "scbench_passkey"]
    (rkv,) = load("repoqa_and_kv")
    assert [(q.max_new_tokens, q.scorers[0]) for q in rkv.questions] == [
        (1024, "scbench_repoqa_and_kv_repoqa"),
        (80, "scbench_repoqa_and_kv_kv"),
    ]
    assert rkv.meta["reserve_tokens"] == (1024 + 80) * 2 // 2 + 1000
    assert load("kv")[0].meta["reserve_tokens"] == 150 * 2 + 1000


# --- prompts -----------------------------------------------------------------------------------------------


def test_official_prompts():
    (kv,) = load("kv")
    assert kv.instruction == "Extract the value corresponding to the specified key in the JSON object below.\n\n"
    assert kv.questions[0].text == rows("kv")[0]["multi_turns"][0]["input"]
    (qa,) = load("qa_eng")
    assert qa.instruction == "Read the book and answer the question. Be very concise in your answer.\n\n"
    assert qa.questions[0].text == "Question: What was the name of the schooner that ran aground?\nAnswer:"
    (zh,) = load("qa_chn")
    assert zh.instruction == "阅读以下书籍然后回答问题。\n\n"
    assert zh.questions[0].text == "问题：林晓考入了哪所大学？\n答案："
    (ch,) = load("choice_eng")
    assert ch.instruction == "Read the book and answer the question.\n\n"
    assert ch.questions[1].text == (
        "Question: How many sailors did Mara bring ashore?\nA. two\nB. three\nC. four\nD. eleven\n\n"
        "The the correct answer is"
    )
    assert ch.questions[1].references == ("four", "two", "three", "four", "eleven")
    (rq,) = load("repoqa")
    assert rq.instruction.startswith("Based on the function description and code context")
    assert rq.instruction.endswith("in a code block wrapped by ```:\n\n")
    for task in ("prefix_suffix", "vt", "many_shot", "summary", "summary_with_needles", "repoqa_and_kv"):
        (ctx,) = load(task)
        assert ctx.instruction == ""
        assert [q.text for q in ctx.questions] == [t["input"] for t in rows(task)[0]["multi_turns"]]


def test_mf_prefix_question_and_list_body():
    (mf,) = load("mf")
    row = rows("mf")[0]
    assert mf.body == str(row["context"]) == "[47, 3, 88, 12, 5, 61, 29, 74, 2, 56]"
    assert mf.instruction == row["multi_turns"][0]["input"] + "\n\n"
    assert mf.questions[0].text == "What is the largest number of the list?\n\n" + row["multi_turns"][0]["input"]
    assert mf.questions[1].text.startswith("What is the smallest number of the list?\n\n")
    assert [q.references for q in mf.questions] == [("88",), ("2",)]


def test_vt_context_under_input_and_list_answers():
    (vt,) = load("vt")
    assert "VAR QXHVE = 53218" in vt.body
    assert vt.questions[0].references == ("QXHVE", "ZLPRA", "MKTUW")


def test_many_shot_and_repoqa_meta():
    assert load("many_shot")[0].meta["subtask"] == "snarks"
    meta = load("repoqa")[0].meta
    assert (meta["lang"], meta["repo"]) == ("python", "kvbench/tiny-utils")


# --- layouts -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", sb.TASKS)
@pytest.mark.parametrize("layout", ["jsonl", "inferred-parquet"])
def test_other_layouts_give_the_same_contexts(task, layout, tmp_path):
    """The same rows as jsonl (``scbench_<task>/*.jsonl``) or as parquet with types inferred by pyarrow give the
    contexts of the committed hub-schema parquet."""
    folder = tmp_path / "scbench" / f"scbench_{task}"
    if layout == "jsonl":
        write_jsonl(folder / "test-00000-of-00001.jsonl", rows(task))
    else:
        write_parquet(folder / "test-00000-of-00001.parquet", rows(task))
    assert load(task, data_dir=tmp_path) == load(task)


_S, _I = pa.string(), pa.int64()


def _turns(*fields: tuple[str, pa.DataType]) -> pa.DataType:
    return pa.list_(pa.struct([pa.field(name, kind) for name, kind in fields]))


_QA = _turns(("answer", _S), ("input", _S))
#: The hub's parquet schema per config. From the card's ``dataset_info`` (rev 283310b): kv, prefix_suffix,
#: qa_eng, qa_chn, choice_eng, many_shot, mf (column order as the card lists them); vt as
#: :mod:`kvbench.tasks.scbench_generate` documents it (``index``, ``input``, ``length``, no ``id``); repoqa,
#: summary and the mixed tasks from the fields the official runner reads (``id`` int64 as elsewhere; their
#: column order is not verified).
HUB_SCHEMAS = {
    "kv": pa.schema([("id", _I), ("context", _S), ("multi_turns", _QA)]),
    "prefix_suffix": pa.schema([("context", _S), ("multi_turns", _QA)]),
    "vt": pa.schema(
        [("index", _I), ("input", _S), ("length", _I), ("multi_turns", _turns(("answer", pa.list_(_S)), ("input", _S)))]
    ),
    "repoqa": pa.schema(
        [
            ("id", _I),
            ("lang", _S),
            ("repo", _S),
            ("context", _S),
            ("multi_turns", _turns(("answer", _S), ("input", _S), ("name", _S))),
        ]
    ),
    "qa_eng": pa.schema([("context", _S), ("multi_turns", _QA), ("id", _I)]),
    "qa_chn": pa.schema([("context", _S), ("multi_turns", _QA), ("id", _I)]),
    "choice_eng": pa.schema(
        [("context", _S), ("multi_turns", _turns(("answer", _S), ("input", _S), ("options", pa.list_(_S)))), ("id", _I)]
    ),
    "many_shot": pa.schema([("context", _S), ("multi_turns", _QA), ("id", _I), ("task", _S)]),
    "summary": pa.schema([("context", _S), ("multi_turns", _QA), ("id", _I)]),
    "mf": pa.schema([("id", _I), ("context", pa.list_(_I)), ("multi_turns", _turns(("answer", _I), ("input", _S)))]),
    "summary_with_needles": pa.schema(
        [("context", _S), ("multi_turns", _turns(("answer", _S), ("input", _S), ("task", _S))), ("id", _I)]
    ),
    "repoqa_and_kv": pa.schema(
        [
            ("id", _I),
            ("lang", _S),
            ("repo", _S),
            ("context", _S),
            ("multi_turns", _turns(("answer", _S), ("input", _S), ("name", _S), ("task", _S))),
        ]
    ),
}


@pytest.mark.parametrize("task", sb.TASKS)
def test_fixture_parquet_has_the_hub_schema(task):
    schema = pq.read_schema(fixture_file(task))
    assert schema.remove_metadata() == HUB_SCHEMAS[task]
    assert ("id" in schema.names) == (task not in ("vt", "prefix_suffix"))
    if task in GENERATED_TASKS:  # the offline generator writes the same schema
        assert hub_schema(task) == HUB_SCHEMAS[task]


def test_parquet_field_types_follow_the_card():
    (mf,) = sb.iter_rows([fixture_file("mf")])
    assert mf["context"] == [47, 3, 88, 12, 5, 61, 29, 74, 2, 56] and mf["multi_turns"][0]["answer"] == 88
    (ch,) = sb.iter_rows([fixture_file("choice_eng")])
    assert ch["multi_turns"][1]["options"] == ["two", "three", "four", "eleven"]
    (vt,) = sb.iter_rows([fixture_file("vt")])
    assert set(vt) == {"index", "input", "length", "multi_turns"} and vt["multi_turns"][0]["answer"] == [
        "QXHVE", "ZLPRA", "MKTUW"
    ]  # fmt: skip
    # mixed turns share one struct: kv turns get name=None in parquet, which the loader accepts
    (rkv,) = sb.iter_rows([fixture_file("repoqa_and_kv")])
    assert rkv["multi_turns"][1]["name"] is None and rkv["multi_turns"][1]["task"] == "scbench_kv"


@pytest.mark.parametrize("where", ["data/scbench_kv.jsonl", "scbench_kv.jsonl", "scbench_kv/part.jsonl"])
def test_raw_jsonl_layouts(where, tmp_path):
    write_jsonl(tmp_path / "scbench" / where, rows("kv"))
    assert load("kv", data_dir=tmp_path) == load("kv")


def test_env_data_dir(monkeypatch):
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(FIXTURES))
    ctxs = list(get_bench("scbench").contexts("qa_chn", length=0, limit=1, seed=0, prompt_length=None))
    assert ctxs == load("qa_chn")


def test_limit_counts_rows_and_seed_length_unused(tmp_path):
    base = rows("kv")[0]
    write_jsonl(tmp_path / "scbench" / "scbench_kv" / "t.jsonl", [dict(base, id=i) for i in range(3)])
    bench = sb.SCBenchBench(data_dir=tmp_path)
    two = list(bench.contexts("kv", length=10, limit=2, seed=1, prompt_length=lambda c: 10**9))
    assert [c.item for c in two] == ["0", "1"] and [c.meta["id"] for c in two] == [0, 1]
    assert two == list(bench.contexts("kv", length=999, limit=2, seed=7, prompt_length=None))
    assert list(bench.contexts("kv", length=0, limit=0, seed=0, prompt_length=None)) == []


# --- missing data and the hub ------------------------------------------------------------------------------


def test_missing_task_names_path_and_fix(tmp_path):
    """The data directory holds SCBench data (another task): a task without files there is missing (it is
    not generated), and the error names the task, where it looked, and how to supply the data."""
    write_jsonl(tmp_path / "scbench" / "scbench_qa_eng" / "t.jsonl", rows("qa_eng"))
    with pytest.raises(sb.MissingDataError) as err:
        sb.SCBenchBench(data_dir=tmp_path).contexts("kv", length=0, limit=1, seed=0, prompt_length=None)
    assert isinstance(err.value, KvbenchError)
    msg = str(err.value)
    assert f"no scbench_kv data under {tmp_path / 'scbench'}" in msg and "scbench_kv/*.parquet" in msg
    assert "--data-dir" in msg and "KVBENCH_DATA_DIR" in msg and sb.HUB_ENV in msg and "microsoft/SCBench" in msg


def test_missing_when_no_data_dir_is_set():
    """No data directory and no hub: a task kvbench does not generate is missing, and says so."""
    with pytest.raises(sb.MissingDataError, match="needs SCBench's hub data \\(no SCBench data given"):
        get_bench("scbench").contexts("qa_eng", length=0, limit=1, seed=0, prompt_length=None)


def _fake_datasets(monkeypatch, loader):
    mod = types.ModuleType("datasets")
    mod.load_dataset = loader
    monkeypatch.setitem(sys.modules, "datasets", mod)


def test_hub_opt_in(monkeypatch, tmp_path):
    calls = []

    def load_dataset(*args, **kw):
        calls.append((args, kw))
        return rows("kv")

    _fake_datasets(monkeypatch, load_dataset)
    monkeypatch.setenv(sb.HUB_ENV, "1")
    ctxs = list(get_bench("scbench").contexts("kv", length=0, limit=1, seed=0, prompt_length=None))
    assert ctxs == load("kv")
    assert calls == [(("microsoft/SCBench", "scbench_kv"), {"split": "test"})]
    # local data wins over the hub
    assert load("kv", data_dir=FIXTURES, hub=True) == load("kv") and len(calls) == 1


def test_hub_failure_is_missing_data(monkeypatch, tmp_path):
    def load_dataset(*args, **kw):
        raise ConnectionError("offline")

    _fake_datasets(monkeypatch, load_dataset)
    with pytest.raises(sb.MissingDataError, match="offline") as err:
        sb.SCBenchBench(data_dir=tmp_path, hub=True).contexts("kv", length=0, limit=1, seed=0, prompt_length=None)
    # the reason names the task, the directory and the cause; the fix is every task's
    root = tmp_path / "scbench"
    assert err.value.reason == (
        f"no scbench_kv data under {root} (scbench_kv/*.parquet or *.jsonl, data/scbench_kv.jsonl) "
        "(loading microsoft/SCBench config scbench_kv from the hub failed: offline)"
    )
    assert err.value.fix == sb._FIX and "kvbench data fetch scbench" in err.value.fix


# --- repoqa needle pool ------------------------------------------------------------------------------------


def test_needle_pool_spans_the_whole_file(tmp_path):
    first = rows("repoqa")[0]
    other = json.loads(json.dumps(first))
    other["multi_turns"] = [
        {"input": "d", "name": "slugify", "answer": "def slugify(text):\n    return text.lower().replace(' ', '-')"},
        first["multi_turns"][0],  # a duplicate needle: kept once
    ]
    elsewhere = dict(json.loads(json.dumps(first)), repo="someone/else")
    write_jsonl(tmp_path / "scbench" / "scbench_repoqa" / "x.jsonl", [first, elsewhere, other])
    (ctx,) = load("repoqa", data_dir=tmp_path, limit=1)  # limit does not shrink the pool
    _, lang, name, needles = parse_repoqa_references(ctx.questions[0].references)
    assert (lang, name) == ("python", "clamp")
    assert [n for n, _ in needles] == ["clamp", "running_mean", "slugify"]


def test_repoqa_and_kv_pool_has_only_repoqa_turns():
    (ctx,) = load("repoqa_and_kv")
    _, _, _, needles = parse_repoqa_references(ctx.questions[0].references)
    assert [n for n, _ in needles] == ["running_mean"]
    assert ctx.questions[1].references == ("feedface-8888-4999-aaaa-bbbbccccdddd",)


# --- malformed rows ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "task, mutate, match",
    [
        ("choice_eng", lambda r: r["multi_turns"][0].update(answer="Nowhere"), "not one of its options"),
        ("choice_eng", lambda r: r["multi_turns"][0].update(options=["a", "b"]), "4 strings"),
        ("summary_with_needles", lambda r: r["multi_turns"][1].update(task="scbench_kv"), "task must be one of"),
        ("repoqa_and_kv", lambda r: r["multi_turns"][1].pop("task"), "task must be one of"),
        ("repoqa", lambda r: r.update(lang="cobol"), "lang must be one of"),
        ("repoqa", lambda r: r["multi_turns"][0].pop("name"), "name must be a string"),
        ("mf", lambda r: r["multi_turns"][0].update(input="Which one?"), "no 'The ... is' target"),
        ("mf", lambda r: r["multi_turns"][0].update(answer="88"), "must be an int"),
        ("mf", lambda r: r.update(context=[1, "2"]), "list of ints"),
        ("kv", lambda r: r.update(multi_turns=[]), "non-empty list"),
        ("kv", lambda r: r.pop("context"), "context must be a string"),
        ("qa_chn", lambda r: r["multi_turns"][0].update(answer=["北京大学"]), "answer must be a string"),
    ],
)
def test_malformed_rows_raise_data_errors(task, mutate, match, tmp_path):
    row = rows(task)[0]
    mutate(row)
    write_jsonl(tmp_path / "scbench" / f"scbench_{task}" / "t.jsonl", [row])
    with pytest.raises(sb.SCBenchDataError, match=match) as err:
        load(task, data_dir=tmp_path)
    assert isinstance(err.value, KvbenchError) and "row 0" in str(err.value)


def test_mf_list_answer_accepted():
    row = rows("mf")[0]
    row["multi_turns"][0]["answer"] = [88]
    ctx = sb.build_context("mf", 0, row)
    assert ctx.questions[0].references == ("88",)


def test_bad_json_line(tmp_path):
    path = tmp_path / "scbench" / "scbench_kv" / "t.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("{not json\n")
    with pytest.raises(sb.SCBenchDataError, match="not a JSON line"):
        load("kv", data_dir=tmp_path)


# --- real data, where an operator put it -------------------------------------------------------------------


@pytest.mark.parametrize("task", sb.TASKS)
def test_real_data_first_row_if_present(task, tmp_path):
    root = SHARED / "scbench"
    if not sb.find_task_files(root, task):  # optional: ../shared/data (CI's required data) holds no SCBench files
        pytest.skip(f"no real SCBench data for {task} under {root} (optional: `kvbench data fetch --bench scbench`)")
    (ctx,) = load(task, data_dir=SHARED, limit=1)
    assert ctx.body and ctx.questions
    for q in ctx.questions:
        for name in q.scorers:
            assert 0.0 <= get_scorer(name)("", q.references) <= 100.0


def test_fixture_dir_is_the_hub_layout():
    for task in sb.TASKS:
        assert sb.find_task_files(FIXTURES / "scbench", task) == [fixture_file(task)]


# --- through the core's renderer ---------------------------------------------------------------------------


def test_rendered_prompt_matches_the_official_scdq_layout():
    from kvbench.models import byte_tokenizer
    from kvbench.prompt import render

    tok = byte_tokenizer()
    (ctx,) = load("qa_chn")
    r = render(tok, ctx)
    text = tok.decode(r.prefix_ids + r.body_ids + r.question_ids[0])
    # official scdq: chat head + "阅读以下书籍然后回答问题。\n\n" + context, then the query appended directly
    assert text == (
        "<|im_start|>user\n阅读以下书籍然后回答问题。\n\n"
        + ctx.body
        + "问题：林晓考入了哪所大学？\n答案：<|im_end|>\n<|im_start|>assistant\n"
    )
    for task in sb.TASKS:
        (ctx,) = load(task)
        r = render(tok, ctx, max_length=4096)
        assert r.truncated_from is None and len(r.question_ids) == len(ctx.questions)
