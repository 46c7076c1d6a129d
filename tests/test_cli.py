"""CLI round trip, a method defined in this file run end to end, bad input, and resume after a crash."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from kvbench import budgets, cli
from kvbench.methods import EvictionMethod, register_method
from kvbench.results.read import read_results
from kvbench.results.store import ResultsStore

LENGTH = "900"  # byte tokenizer: room for a few haystack lines plus 128 generated tokens
# The suite runs the random-weight byte-tokenizer model (fast); tests/test_builtin_model.py covers the default.
MODEL = ("--model", "tiny-random")


@register_method
class KeyNormForTest(EvictionMethod):
    """Keeps the keys with the smallest norm (a method defined outside the package)."""

    name = "test-keynorm"
    default_allocation = "pyramid"

    def score(self, parent):
        return [-parent.keys(f).float().norm(dim=-1) for f in range(parent.n_attn_layers)]


def kvbench(*args: str, capsys=None) -> int:
    """Run the console entry point in-process; return its exit code."""
    old = sys.argv
    sys.argv = ["kvbench", *args]
    try:
        cli.main()
        return 0
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        sys.argv = old


def read_rows(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_custom_method_end_to_end_through_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the report's default --out: reports/<results dir name> here
    out = tmp_path / "run"
    args = ["run", *MODEL, "--method", "test-keynorm,full", "--p", "0.5,0.1", "--limit", "2", "--length", LENGTH]
    code = kvbench(*args, "--out", str(out))
    assert code == 0, capsys.readouterr().err
    rows = read_rows(out)
    assert len(rows) == 2 * 2 + 2  # two p for the custom method, p=1.0 for full, two contexts
    custom = [r for r in rows if r["method"] == "test-keynorm"]
    assert {r["allocation"] for r in custom} == {"pyramid"}
    for r in custom:
        k = budgets.per_head_budget(r["n_context"], r["prot"], r["p"])
        assert r["kept_entries"] == 3 * 2 * (r["prot"] + k)  # 3 attention layers x 2 KV heads, pyramid total
        assert r["stored_bytes"] < r["full_bytes"] and r["real_fork"] and r["random_weights"]
    full = [r for r in rows if r["method"] == "full"]
    assert all(r["p"] == 1.0 and r["kept_entries"] == r["full_entries"] for r in full)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runs"][0]["model"] == "tiny-random" and len(manifest["runs"][0]["model_fingerprint"]) == 64

    # rerun: nothing new, nothing duplicated
    assert kvbench(*args, "--out", str(out)) == 0
    assert read_rows(out) == rows
    assert "6 already present" in capsys.readouterr().err.replace("\n", " ")

    assert kvbench("report", "--results", str(out)) == 0
    report = (tmp_path / "reports" / "run" / "report.md").read_text()
    assert not (out / "report.md").exists()  # nothing written into the results directory
    assert "test-keynorm [pyramid]" in report and "p=0.5" in report and "random" in report.lower()


def test_list_commands(capsys):
    for what, expected in [
        ("methods", "test-keynorm"),
        ("benches", "needle"),
        ("models", "tiny-random"),
        ("allocations", "pyramid"),
    ]:
        assert kvbench("list", what) == 0
        assert expected in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "nope"], "valid methods"),
        (["--bench", "nope"], "valid benches"),
        (["--task", "nope"], "valid tasks"),
        (["--p", "1.5"], "outside (0, 1]"),
        (["--p", "0"], "outside (0, 1]"),
        (["--allocation", "nope"], "valid allocations"),
        (["--shard", "3/2"], "0 <= i < N"),
        (["--engine", "nope"], "valid engines"),
        (["--engine", "vllm", "--dtype", "float32"], "bfloat16 only"),
        (["--model", "/nonexistent/model"], "not a built-in model"),
        (["--limit", "0"], "at least 1"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, capsys, args, message):
    code = kvbench("run", *args, "--out", str(tmp_path / "o"), "--length", LENGTH, "--limit", "1", *args)
    err = capsys.readouterr().err.replace("\n", " ")
    assert code == 2 and message in err and "Traceback" not in err


def test_vllm_engine_without_vllm_names_the_setup(tmp_path, capsys):
    """In an environment without vLLM, --engine vllm is one line naming scripts/setup_vllm.sh."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here, so the missing-vLLM error cannot occur")
    code = kvbench("run", "--engine", "vllm", *MODEL, "--out", str(tmp_path / "o"), "--length", LENGTH, "--limit", "1")
    err = capsys.readouterr().err.replace("\n", " ")
    assert code == 2 and "setup_vllm.sh" in err and "Traceback" not in err


def test_unwritable_output_dir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert kvbench("run", "--out", str(blocker / "sub"), "--limit", "1", "--length", LENGTH) == 2
    assert "--out" in capsys.readouterr().err


def test_report_without_results(tmp_path, capsys):
    assert kvbench("report", "--results", str(tmp_path)) == 2
    assert "kvbench run" in capsys.readouterr().err


def test_resume_after_crash_gives_the_uninterrupted_rows(tmp_path, monkeypatch, capsys):
    args = ["run", *MODEL, "--method", "random", "--p", "0.9,0.5,0.1", "--limit", "2", "--length", LENGTH]
    assert kvbench(*args, "--out", str(tmp_path / "clean")) == 0
    clean = read_rows(tmp_path / "clean")

    calls = {"n": 0}
    original = ResultsStore.append

    def crashing_append(self, row):
        if calls["n"] == 4:
            # a crash in the middle of writing the fifth row: half a line reaches the file
            with open(self.path, "ab") as fh:
                fh.write(json.dumps(row).encode()[:40])
            raise KeyboardInterrupt
        calls["n"] += 1
        original(self, row)

    monkeypatch.setattr(ResultsStore, "append", crashing_append)
    assert kvbench(*args, "--out", str(tmp_path / "crash")) == 130
    monkeypatch.setattr(ResultsStore, "append", original)
    assert kvbench(*args, "--out", str(tmp_path / "crash")) == 0
    assert "partial last line" in capsys.readouterr().err.replace("\n", " ")
    resumed = read_rows(tmp_path / "crash")
    # timings and the batch a row was answered in (a resumed context answers only its pending children together)
    strip = lambda r: {k: v for k, v in r.items() if not k.endswith("_s") and k != "answer_batch"}  # noqa: E731
    key = lambda r: (r["item"], r["p"])  # noqa: E731
    assert [strip(r) for r in sorted(resumed, key=key)] == [strip(r) for r in sorted(clean, key=key)]


def test_shards_partition_the_contexts(tmp_path):
    """Shards of one run share an --out, each writing its own results file; readers merge them."""
    base = ["run", *MODEL, "--method", "full", "--limit", "3", "--length", LENGTH, "--out", str(tmp_path)]
    for i in range(2):
        assert kvbench(*base, "--shard", f"{i}/2") == 0
    items = [sorted(r["item"] for r in ResultsStore(tmp_path, (i, 2)).rows()) for i in range(2)]
    assert items == [["0", "2"], ["1"]]
    assert sorted(r["item"] for r in read_results(tmp_path).rows) == ["0", "1", "2"]


def test_random_method_is_seeded_per_context():
    from kvbench.methods import get_method

    class Parent:
        n_kv_heads, n, n_attn_layers = 2, 10, 3
        sha256 = "ab" * 32

    a, b = get_method("random", seed=1).score(Parent()), get_method("random", seed=1).score(Parent())
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=False))
    Parent.sha256 = "cd" * 32
    assert not torch.equal(get_method("random", seed=1).score(Parent())[0], a[0])


def _register_half_bench(bench: str, good: str, bad: str, error: type[Exception], message: str) -> None:
    """Register bench ``bench``: task ``good`` yields needle contexts, task ``bad`` raises ``error(message)``."""
    from kvbench.tasks import Bench, register_bench
    from kvbench.tasks.needle import NeedleBench

    @register_bench
    class Half(Bench):
        name = bench

        def tasks(self):
            return [good, bad]

        def contexts(self, task, *, length, limit, seed, prompt_length):
            if task == bad:
                raise error(message)
            for ctx in NeedleBench().contexts(
                "niah_single_1", length=length, limit=limit, seed=seed, prompt_length=prompt_length
            ):
                yield type(ctx)(self.name, task, ctx.item, ctx.instruction, ctx.body, ctx.questions, ctx.meta)


def test_missing_data_is_recorded_and_reported(tmp_path, monkeypatch, capsys):
    from kvbench.errors import MissingDataError

    message = "ruler/absent.json not found; set --data-dir"
    _register_half_bench("test-half-missing", "present", "absent", MissingDataError, message)

    out = tmp_path / "m"
    assert (
        kvbench(
            "run",
            *MODEL,
            "--bench",
            "test-half-missing",
            "--method",
            "full",
            "--limit",
            "1",
            "--length",
            LENGTH,
            "--out",
            str(out),
        )
        == 0
    )
    assert {r["task"] for r in read_rows(out)} == {"present"}
    monkeypatch.chdir(tmp_path)
    assert kvbench("report", "--results", str(out)) == 0
    report = (tmp_path / "reports" / "m" / "report.md").read_text()
    assert "test-half-missing/absent** missing: ruler/absent.json not found" in report
    assert "absent" in capsys.readouterr().out


def test_a_task_too_long_for_length_is_recorded_unless_asked_for(tmp_path, monkeypatch, capsys):
    """Running every task of a bench, one whose smallest prompt exceeds --length is recorded and listed in
    the report (the others run); asking for it by name is an error naming the length it needs."""
    from kvbench.errors import TooShortError

    message = f"--length {LENGTH} is too short for test-half-long/long; use --length >= 5000"
    _register_half_bench("test-half-long", "fits", "long", TooShortError, message)

    out = tmp_path / "l"
    base = ["run", *MODEL, "--bench", "test-half-long", "--method", "full", "--limit", "1", "--length", LENGTH]
    assert kvbench(*base, "--out", str(out)) == 0, capsys.readouterr().err
    assert {r["task"] for r in read_rows(out)} == {"fits"}
    assert "test-half-long/long" in json.loads((out / "missing.json").read_text())
    monkeypatch.chdir(tmp_path)
    assert kvbench("report", "--results", str(out)) == 0
    assert "long** missing: does not fit: --length 900 is too short" in (tmp_path / "reports/l/report.md").read_text()
    capsys.readouterr()
    assert kvbench(*base, "--task", "long", "--out", str(tmp_path / "named")) == 2
    assert "use --length >= 5000" in capsys.readouterr().err.replace("\n", " ")


def test_a_later_item_too_long_ends_its_task_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    """A task whose first items fit --length but a later one does not (RULER's cwe at 4,096 tokens with the
    shipped tokenizer: item 31 needs 4,230) ends there, even when named with --task: said with the item and the
    fix, recorded in missing.json and listed in the report, and the run's other tasks still run."""
    from kvbench.errors import TooShortError
    from kvbench.tasks import Bench, register_bench
    from kvbench.tasks.needle import NeedleBench

    message = "--length 900 is too short for test-later-long/shrinks; use --length >= 5000"

    @register_bench
    class LaterLong(Bench):
        name = "test-later-long"

        def tasks(self):
            return ["shrinks", "fits"]

        def contexts(self, task, *, length, limit, seed, prompt_length):
            items = NeedleBench().contexts(
                "niah_single_1", length=length, limit=limit, seed=seed, prompt_length=prompt_length
            )
            for i, ctx in enumerate(items):
                if task == "shrinks" and i == 1:
                    raise TooShortError(message)
                yield type(ctx)(self.name, task, ctx.item, ctx.instruction, ctx.body, ctx.questions, ctx.meta)

    out = tmp_path / "later"
    args = ["run", *MODEL, "--bench", "test-later-long", "--task", "shrinks,fits", "--method", "full", "--limit", "3"]
    assert kvbench(*args, "--length", LENGTH, "--out", str(out)) == 0
    err = capsys.readouterr().err.replace("\n", " ")
    assert "test-later-long/shrinks: item 1 cannot run, so the task ends after 1 item" in err
    assert "use --length >= 5000" in err
    rows = read_rows(out)
    want = [("fits", "0"), ("fits", "1"), ("fits", "2"), ("shrinks", "0")]
    assert sorted((r["task"], r["item"]) for r in rows) == want
    recorded = json.loads((out / "missing.json").read_text())["test-later-long/shrinks"]
    assert recorded.startswith("ends after 1 item: --length 900 is too short")
    monkeypatch.chdir(tmp_path)
    assert kvbench("report", "--results", str(out)) == 0
    assert (
        "**test-later-long/shrinks** ends after 1 item: --length 900"
        in (tmp_path / "reports/later/report.md").read_text()
    )


def test_every_method_end_to_end_on_needle(tmp_path, monkeypatch, capsys):
    """Offline artifacts produced by the project's own commands, then every built-in method through
    `kvbench run` at p = 0.9, 0.5, 0.1 (issue: baseline zoo end to end)."""
    from kvbench.methods import list_methods

    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus" / "synthetic"
    corpus.mkdir(parents=True)
    for i in range(3):
        (corpus / f"d{i}.txt").write_text(" ".join(f"word{(i * 7 + j) % 23}" for j in range(60)))
    assert kvbench("calibrate", "triattention", *MODEL, "--corpus", str(tmp_path / "corpus")) == 0
    labels = tmp_path / "labels"
    assert (
        kvbench(
            "gatesight",
            "label",
            "--model",
            "tiny-random",
            "--corpus",
            str(tmp_path / "corpus"),
            "--out",
            str(labels),
            "--m",
            "1",
            "--max-new-tokens",
            "8",
            "--threads",
            "1",
        )
        == 0
    )
    assert kvbench("gatesight", "train", "--labels", str(labels), "--epochs", "1", "--positions", "50") == 0

    methods = [m for m in list_methods() if not m.startswith("test-")]
    assert {"full", "random", "snapkv", "keydiff", "triattention", "kvzip", "gatesight"} <= set(methods)
    out = tmp_path / "all"
    code = kvbench(
        "run",
        *MODEL,
        "--method",
        ",".join(methods),
        "--p",
        "0.9,0.5,0.1",
        "--limit",
        "1",
        "--length",
        LENGTH,
        "--out",
        str(out),
    )
    assert code == 0, capsys.readouterr().err
    rows = read_rows(out)
    got = {(r["method"], r["p"]) for r in rows}
    expected = {("full", 1.0)} | {(m, p) for m in methods if m != "full" for p in (0.9, 0.5, 0.1)}
    assert got == expected
    for r in rows:
        k = budgets.per_head_budget(r["n_context"], r["prot"], r["p"])
        assert r["kept_entries"] == 3 * 2 * (r["prot"] + k), r["method"]
        assert r["real_fork"] and (r["stored_bytes"] < r["full_bytes"]) == (r["p"] < 1.0)
    alloc = {r["method"]: r["allocation"] for r in rows}
    assert alloc["gatesight"] == "gate" and alloc["kvzip"] == "global" and alloc["snapkv"] == "flat"


FIXTURES = Path(__file__).parent / "fixtures"


def test_ruler_and_scbench_end_to_end_on_fixtures(tmp_path, monkeypatch, capsys):
    """Both real benches through `kvbench run` and `report` with the tiny model, `--limit 1`, on the
    shipped fixtures (the essay file is absent there: naming an essay task is an error that says what is
    missing, and writes nothing)."""
    out = tmp_path / "benches"
    common = [*MODEL, "--method", "full,keydiff", "--p", "0.5", "--limit", "1", "--data-dir", str(FIXTURES)]
    common += ["--out", str(out)]
    assert kvbench("run", "--bench", "ruler", "--task", "niah_single_2", "--length", "2048", *common) == 2
    err = capsys.readouterr().err
    assert "PaulGrahamEssays.json" in err and "--data-dir" in err and not (out / "manifest.json").exists()
    assert kvbench("run", "--bench", "ruler", "--task", "niah_single_1,qa_1", "--length", "2048", *common) == 0, (
        capsys.readouterr().err
    )
    assert kvbench("run", "--bench", "scbench", "--task", "kv,choice_eng,mf", *common) == 0, capsys.readouterr().err
    rows = read_rows(out)
    assert {(r["bench"], r["task"]) for r in rows} == {
        ("ruler", "niah_single_1"),
        ("ruler", "qa_1"),
        ("scbench", "kv"),
        ("scbench", "choice_eng"),
        ("scbench", "mf"),
    }
    scb = [r for r in rows if r["bench"] == "scbench"]
    assert all(len(r["scores"]) == 2 and any(k.endswith("_revised") for k in r["scores"]) for r in scb)
    # the row's primary score is the official scorer's (the question's first), never the revised one
    assert all(r["scorer"] == f"scbench_{r['task']}" and r["score"] == r["scores"][r["scorer"]] for r in scb)
    assert {r["method"] for r in rows} == {"full", "keydiff"}
    monkeypatch.chdir(tmp_path)
    assert kvbench("report", "--results", str(out)) == 0
    report = (tmp_path / "reports" / "benches" / "report.md").read_text()
    assert "choice_eng" in report and "niah_single_1" in report


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "add --export"),  # a note with nothing to export
        (["--export", "EXPORT"], "cannot read it"),  # the note file is missing
    ],
)
def test_train_tiny_card_note_errors_before_training(tmp_path, capsys, extra, message):
    """--card-note is checked before any step runs: no checkpoint is written when it is unusable."""
    extra = [str(tmp_path / "ship") if a == "EXPORT" else a for a in extra]
    note = tmp_path / ("missing.md" if extra else "note.md")
    if not extra:
        note.write_text("measured by hand")
    code = kvbench("train-tiny", "--out", str(tmp_path / "run"), "--steps", "1", "--card-note", str(note), *extra)
    err = capsys.readouterr().err.replace("\n", " ")
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
