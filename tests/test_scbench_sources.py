"""Where SCBench's contexts come from: the hub's rows when the data directory has SCBench data, kvbench's
offline-generated kv / mf / prefix_suffix / vt otherwise (labelled ``source="generated"`` in the context,
the row and its identity), and missing data reported in one line per reason with the fix once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvbench.errors import MissingDataError
from kvbench.models import byte_tokenizer
from kvbench.prompt import prompt_length, render
from kvbench.tasks import scbench as sb
from kvbench.tasks import scbench_generate as gen
from tests.test_cli import MODEL, kvbench, read_rows

FIXTURES = Path(__file__).parent / "fixtures"
LENGTH = 2048


@pytest.fixture(autouse=True)
def _no_env(monkeypatch, tmp_path):
    monkeypatch.delenv("KVBENCH_DATA_DIR", raising=False)
    monkeypatch.delenv(sb.HUB_ENV, raising=False)
    monkeypatch.delenv(sb.MAX_TURNS_ENV, raising=False)
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))


def _contexts(task, bench=None, limit=2, seed=42, length=LENGTH):
    bench = bench or sb.SCBenchBench()
    measure = prompt_length(byte_tokenizer())
    return list(bench.contexts(task, length=length, limit=limit, seed=seed, prompt_length=measure))


@pytest.mark.parametrize("task", gen.GENERATED_TASKS)
def test_without_data_the_generated_tasks_run_in_scbench_assembly(task):
    tok = byte_tokenizer()
    contexts = _contexts(task)
    assert len(contexts) == 2
    for ctx in contexts:
        assert ctx.source == "generated" and ctx.assembly == "scbench" and len(ctx.questions) == gen.TURNS
        r = render(tok, ctx)
        need = max(len(q) + spec.max_new_tokens for q, spec in zip(r.question_ids, ctx.questions, strict=True))
        assert len(r.context_ids) + need <= LENGTH  # sized to --length with the model's tokenizer
    # seeded: the same seed gives the same contexts, another seed others
    assert _contexts(task) == contexts and _contexts(task, seed=7) != contexts


@pytest.mark.parametrize("task", ["repoqa", "qa_eng", "summary_with_needles"])
def test_without_data_the_other_tasks_are_missing_with_one_reason_and_the_fix(task):
    with pytest.raises(MissingDataError) as info:
        _contexts(task)
    err = info.value
    assert "needs SCBench's hub data" in err.reason and "\n" not in err.reason and task not in err.reason
    assert "--data-dir" in err.fix and "KVBENCH_SCBENCH_HUB" in err.fix


def test_with_hub_data_nothing_is_generated(tmp_path):
    """A data directory holding any SCBench task: its rows are read, a task it lacks is missing (kv here,
    though kv can be generated), so hub and generated items never mix in one run."""
    data = tmp_path / "data"
    (data / "scbench").mkdir(parents=True)
    fixture = FIXTURES / "scbench" / "scbench_mf"
    (data / "scbench" / "scbench_mf").symlink_to(fixture.resolve())
    bench = sb.SCBenchBench(data_dir=data)
    (ctx,) = _contexts("mf", bench)
    assert ctx.source == "hub"
    with pytest.raises(MissingDataError, match="no scbench_kv data under"):
        _contexts("kv", bench)


def test_generated_rows_are_cached_and_reused(tmp_path, monkeypatch):
    calls = []
    real = gen.generate_row

    def counting(*args, **kw):
        calls.append(args)
        return real(*args, **kw)

    monkeypatch.setattr(gen, "generate_row", counting)
    bench = sb.SCBenchBench()
    bench.cache_dir = tmp_path / "cache" / "scbench"
    first = _contexts("kv", bench, limit=3)
    assert len(calls) == 3 and len(list(bench.cache_dir.iterdir())) == 1
    assert _contexts("kv", bench, limit=3) == first and len(calls) == 3  # read back, not regenerated
    assert _contexts("kv", bench, limit=4)[:3] == first and len(calls) == 4  # only the new row is drawn
    # a corrupt cache file is regenerated, with the same rows
    (path,) = bench.cache_dir.iterdir()
    path.write_text("{not json\n")
    assert _contexts("kv", bench, limit=3) == first and len(calls) == 7


def test_max_turns_caps_the_questions_asked(monkeypatch):
    monkeypatch.setenv(sb.MAX_TURNS_ENV, "2")
    (ctx,) = _contexts("kv", limit=1)
    assert len(ctx.questions) == 2 and ctx.meta["n_turns"] == gen.TURNS
    monkeypatch.setenv(sb.MAX_TURNS_ENV, "zero")
    with pytest.raises(sb.KvbenchError, match="KVBENCH_SCBENCH_MAX_TURNS"):
        _contexts("kv", limit=1)


def test_run_without_data_writes_generated_rows_and_says_so_in_one_line(tmp_path, capsys):
    """The headline command on a fresh clone: the four generated tasks run, every row says `generated`
    (also in its identity), the 8 tasks needing hub data are named once, and the output stays short."""
    out = tmp_path / "run"
    code = kvbench("run", *MODEL, "--method", "full", "--bench", "scbench", "--p", "0.5", "--limit", "1",
                   "--length", str(LENGTH), "--threads", "1", "--out", str(out))  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    rows = read_rows(out)
    assert {r["task"] for r in rows} == set(gen.GENERATED_TASKS)
    assert len(rows) == len(gen.GENERATED_TASKS) * gen.TURNS
    assert all(r["source"] == "generated" and r["bench"] == "scbench" for r in rows)
    assert len(err.encode()) < 3000, err
    missing = [line for line in err.splitlines() if "needs SCBench's hub data" in line]
    assert len(missing) == 1 and "8 tasks" in missing[0], err
    assert err.count("--data-dir") == 1, err
    # the report gives them their own, labelled section
    assert kvbench("report", "--results", str(out), "--out", str(tmp_path / "rep")) == 0
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "SCBench (generated offline: kv, mf, prefix_suffix, vt)" in report


def test_a_hub_only_task_without_data_exits_2_and_leaves_out_as_it_was(tmp_path, capsys):
    out = tmp_path / "kept"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code = kvbench("run", *MODEL, "--method", "full", "--bench", "scbench", "--task", "qa_eng", "--out", str(out))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "qa_eng" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    fresh = tmp_path / "fresh"
    assert kvbench("run", *MODEL, "--method", "full", "--bench", "scbench", "--task", "qa_eng", "--out",
                   str(fresh)) == 2  # fmt: skip
    assert not fresh.exists() or not any(os.scandir(fresh))


def test_generated_and_hub_rows_have_different_identities():
    from kvbench.results.keys import row_key

    base = {k: "x" for k in ("model", "engine", "method", "allocation", "bench", "task", "item", "question")}
    base.update(p=0.5, length=1024, seed=42, context_sha256="s", model_fingerprint="f", artifact_sha256=None)
    hub, generated, old = {**base, "source": "hub"}, {**base, "source": "generated"}, dict(base)
    assert row_key(hub) != row_key(generated)
    assert row_key(old) == row_key({**base, "source": None})  # rows before `source` keep their identity
