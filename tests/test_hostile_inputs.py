"""Issue 34 through the CLI: hostile inputs print one line naming the fix and exit 2, before anything is written (a
fresh --out is not even created, an existing one stays byte for byte as it was); each results file has one writer
whatever its names; p is refused where rows could not record it; contexts are drawn as rows are written; markup in
paths is printed as is; SIGTERM stops a run like Ctrl-C."""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import math
import os
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from kvbench.errors import MissingDataError
from kvbench.models import materialize_builtin
from kvbench.results.keys import ResultsError
from kvbench.results.lock import check_results_file
from kvbench.results.read import read_results
from kvbench.run.plan import RunConfig
from kvbench.run.shards import ShardContexts, shard_contexts
from kvbench.tasks import Bench, Context, Question, register_bench
from tests.test_cli import kvbench
from tests.test_results import make_row
from tests.test_store_cli import FAST, MODEL, _existing, _no_data, _readonly_results, _snapshot

CUT = b'{"model": "m", "eng'  # the last line of a run killed mid-write


def _one_error(err: str) -> str:
    """The only error line of ``err`` (asserting there is one and no traceback)."""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _checkpoint(tmp: Path, name: str, change=None) -> None:
    """``tmp/name``: a copy of the tiny-random checkpoint, each tensor ``t`` named ``k`` replaced by ``change(k, t)``
    when given."""
    from safetensors.torch import load_file, save_file

    target = Path(shutil.copytree(materialize_builtin("tiny-random"), tmp / name))
    if change is not None:
        weights = target / "model.safetensors"
        save_file({k: change(k, t) for k, t in load_file(weights).items()}, weights, metadata={"format": "pt"})


def _empty_dir(tmp: Path) -> None:
    (tmp / "empty").mkdir()


def _truncated(tmp: Path) -> None:
    _checkpoint(tmp, "truncated")
    weights = tmp / "truncated" / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)


def _nan_weights(tmp: Path) -> None:
    _checkpoint(tmp, "nan", lambda k, t: torch.full_like(t, math.nan) if k == "lm_head.weight" else t)


def _other_weights(tmp: Path) -> None:
    """Weights no calibration artifact was made for (a fingerprint of their own)."""
    _checkpoint(tmp, "other", lambda k, t: t * 1.5 if t.is_floating_point() else t)


def _every_task_missing(tmp: Path) -> None:
    """Bench ``test-all-missing``: each of its tasks lacks its data (one fix for them all)."""

    @register_bench
    class AllMissing(Bench):
        name = "test-all-missing"

        def tasks(self):
            return ["a", "b"]

        def contexts(self, task, *, length, limit, seed, prompt_length):
            raise MissingDataError(reason=f"{task}.json not found", fix="put it under $KVBENCH_DATA_DIR/x")


# (extra args, message, setup(tmp)): each fails before the first row
BEFORE_THE_FIRST_ROW = [
    (["--model", "TMP/empty"], "has no config.json", _empty_dir),
    (["--model", "TMP/truncated"], "--model TMP/truncated: cannot load its weights", _truncated),
    (
        ["--model", "TMP/nan"],
        "--model TMP/nan: its weights hold NaN or infinite values (first in lm_head.weight)",
        _nan_weights,
    ),
    (["--model", "TMP/other", "--method", "triattention", "--p", "0.5"], "triattention", _other_weights),
    (["--seed", "-1"], "--seed -1: need an integer from 0 to 4294967295", None),
    (["--seed", str(2**64)], f"--seed {2**64}: need an integer from 0 to 4294967295", None),
    (["--length", "200000"], "exceeds the 131072 positions", None),
    (["--bench", "ruler", "--task", "qa_1"], "RULER task qa_1 needs", "no data"),
    (
        ["--bench", "test-all-missing"],
        "a.json not found; test-all-missing/b: b.json not found. Fix: put it",
        _every_task_missing,
    ),
    (["--method", "random", "--p", "0.0001"], "--p 0.0001 keeps none of the", None),
    (["--threads", "1000"], f"--threads 1000 exceeds the {len(os.sched_getaffinity(0))} CPU cores", None),
    (["--p", "1e-9,2e-9"], "--p 1e-09: rows record p to 4 decimals, where it would read 0.0", None),
    (["--p", "0.3333333333"], "where it would read 0.3333; give at most 4 decimals", None),
    (["--p", "0.3333,0.33334"], "--p 0.33334: rows record p to 4 decimals", None),
]


@pytest.mark.parametrize("args, message, setup", BEFORE_THE_FIRST_ROW)
def test_a_run_that_fails_before_its_first_row_writes_nothing(tmp_path, capsys, monkeypatch, args, message, setup):
    """Items 1, 2, 4 and 7 (and NaN weights, --threads, missing artifacts and data): exit 2, one line; a fresh --out
    is not created (no directory, lock, results file or manifest), an existing one keeps every byte, even the cut last
    line a crash left (it is repaired by a run's first row, not before)."""
    if setup == "no data":
        _no_data(tmp_path, monkeypatch)
    elif setup is not None:
        setup(tmp_path)
    args = [a.replace("TMP", str(tmp_path)) for a in args]
    message = message.replace("TMP", str(tmp_path))
    existing = tmp_path / "existing"
    _existing(existing)
    with open(existing / "results.jsonl", "ab") as f:
        f.write(CUT)
    before = _snapshot(existing)
    for out in (tmp_path / "new" / "out", existing):
        assert kvbench("run", *MODEL, *FAST, *args, "--out", str(out)) == 2
        assert message in _one_error(capsys.readouterr().err)
    assert not (tmp_path / "new").exists()
    assert _snapshot(existing) == before and (existing / "results.jsonl.lock").exists()


def _link_to_a_copy(tmp: Path, out: Path) -> None:
    """out/results.jsonl is a symbolic link to another directory's results file (issue 34 item 6)."""
    (tmp / "B").mkdir()
    (out / "results.jsonl").rename(tmp / "B" / "results.jsonl")
    (out / "results.jsonl").symlink_to(tmp / "B" / "results.jsonl")


def _link_to_dev_null(tmp: Path, out: Path) -> None:
    (out / "results.jsonl").rename(out / "kept.jsonl")
    (out / "results.jsonl").symlink_to("/dev/null")


def _hard_link(tmp: Path, out: Path) -> None:
    os.link(out / "results.jsonl", tmp / "another-name.jsonl")


def _lock_is_a_directory(tmp: Path, out: Path) -> None:
    (out / "results.jsonl.lock").unlink()
    (out / "results.jsonl.lock").mkdir()


def _lock_of_another_user(tmp: Path, out: Path, monkeypatch) -> None:
    """The lock file cannot be opened for writing (another user's; root ignores chmod, so the open is refused)."""
    import kvbench.results.lock as results_lock

    real = os.open

    def refuse(path, flags, *a):
        if Path(path).name == "results.jsonl.lock" and flags & os.O_RDWR:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, *a)

    monkeypatch.setattr(results_lock.os, "open", refuse)


def _legacy_rows_beside(tmp: Path, out: Path) -> None:
    legacy = {k: v for k, v in make_row(9).items() if k != "length"}
    (out / "results.shard-1-of-2.jsonl").write_text(json.dumps(legacy) + "\n")


def _read_only_with_a_cut_line(tmp: Path, out: Path, monkeypatch) -> None:
    with open(out / "results.jsonl", "ab") as f:
        f.write(CUT)
    _readonly_results(tmp, monkeypatch)


LOCKS = ("run", "upgrade")
# (setup(tmp, out[, monkeypatch]), message, commands): a results directory its writer cannot use as it is
UNUSABLE_STORES = [
    (_link_to_a_copy, "TMP/out/results.jsonl is a symbolic link (to TMP/B/results.jsonl)", LOCKS),
    (_link_to_dev_null, "TMP/out/results.jsonl is a symbolic link (to /dev/null)", ("run",)),
    (_hard_link, "TMP/out/results.jsonl has 2 hard links", LOCKS),
    (_lock_is_a_directory, "cannot open the lock file TMP/out/results.jsonl.lock (Is a directory)", LOCKS),
    (_lock_of_another_user, "cannot open the lock file TMP/out/results.jsonl.lock (Permission denied)", LOCKS),
    (_legacy_rows_beside, "TMP/out/results.shard-1-of-2.jsonl holds 1 rows of an older kvbench", ("run",)),
    (_read_only_with_a_cut_line, "cannot write TMP/out/results.jsonl: Permission denied", ("run",)),
]


@pytest.mark.parametrize("setup, message, commands", UNUSABLE_STORES)
def test_a_results_directory_its_writer_cannot_use_is_refused_as_it_is(tmp_path, capsys, monkeypatch, setup, message,
                                                                       commands):  # fmt: skip
    """Items 3, 6 and the minor ones: a results file reached through a link (a run through another name would write
    it at once: both exited 0 with duplicated rows), /dev/null (not "a disk problem"), a lock file that cannot be
    opened (a traceback), old rows in another results file, a read-only file with a cut last line (a new .partial
    copy each time): exit 2 in one line, every file (links followed) byte for byte as it was."""
    out = tmp_path / "out"
    _existing(out)
    setup(*(tmp_path, out, monkeypatch)[: setup.__code__.co_argcount])
    before = _snapshot(tmp_path)
    for command in commands:
        args = ("run", *MODEL, *FAST, "--out") if command == "run" else ("results", "upgrade")
        assert kvbench(*args, str(out)) == 2
        assert message.replace("TMP", str(tmp_path)) in _one_error(capsys.readouterr().err)
        assert _snapshot(tmp_path) == before
    assert not list(out.glob("*.partial-*"))


def test_a_results_file_that_is_not_a_regular_file_is_refused_unread(tmp_path):
    """A pipe in place of a results file (reading it would wait for a writer forever)."""
    os.mkfifo(tmp_path / "results.jsonl")
    with pytest.raises(ResultsError, match="results.jsonl is not a regular file: move it away"):
        check_results_file(tmp_path / "results.jsonl")


def test_a_report_without_rows_says_so(tmp_path, capsys):
    """Item 1's other end (an empty results.jsonl, as runs of an older kvbench left) and a results file given in
    place of its directory: one line naming the fix."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_bytes(b"")
    assert kvbench("report", "--results", str(out), "--out", str(tmp_path / "r")) == 2
    assert f"no result rows in {out}" in _one_error(capsys.readouterr().err)
    assert kvbench("report", "--results", str(out / "results.jsonl"), "--out", str(tmp_path / "r")) == 2
    assert f"is a file: give the directory that holds it (its run's --out), e.g. {out}" in _one_error(
        capsys.readouterr().err
    )
    assert not (tmp_path / "r").exists() and [p.name for p in out.iterdir()] == ["results.jsonl"]


def _drawn(monkeypatch, max_new_tokens: int | None = None, most: int | None = None) -> list[str]:
    """The items of the RULER (and needle) contexts drawn from now on, in order, asserting that no more than ``most``
    are drawn when given; each question answers at most ``max_new_tokens`` tokens when given (a quick row: a random
    model never stops before its 128)."""
    from kvbench.tasks.ruler import RulerBench

    drawn, original = [], RulerBench.contexts

    def counted(self, task, **kw):
        for ctx in original(self, task, **kw):
            drawn.append(ctx.item)
            assert most is None or len(drawn) <= most, f"{len(drawn)} contexts drawn, at most {most} expected"
            if max_new_tokens is not None:
                questions = tuple(dataclasses.replace(q, max_new_tokens=max_new_tokens) for q in ctx.questions)
                ctx = dataclasses.replace(ctx, questions=questions)
            yield ctx

    monkeypatch.setattr(RulerBench, "contexts", counted)
    return drawn


def test_markup_in_the_out_path_is_printed_as_is(tmp_path, capsys, monkeypatch):
    """Item 5: `R[/b]` crashed after writing its row (MarkupError, exit 1) and `R[v2]` printed another path."""
    _drawn(monkeypatch, max_new_tokens=2)
    out = tmp_path / "R[v2]" / "x[/b]"
    assert kvbench("run", *MODEL, *FAST, "--out", str(out)) == 0
    err = capsys.readouterr().err
    assert f"-> {out / 'results.jsonl'}" in err and "Traceback" not in err
    assert len(read_results(out).rows) == 1


def test_a_huge_limit_draws_contexts_as_it_goes_and_sigterm_stops_like_ctrl_c(tmp_path, capsys, monkeypatch):
    """Items 8 and SIGTERM: with --limit 1000000000 the first context is prefilled after drawing that one alone
    (every context was built first: nothing written after minutes, memory climbing); SIGTERM there exits 143 with
    the resume hint, as Ctrl-C does (it exited 143 silently), and leaves no trace of the run."""
    from kvbench.engines.torch_engine import TorchEngine

    drawn, prefill = _drawn(monkeypatch, most=1), TorchEngine.prefill

    def prefill_then_sigterm(self, *args, **kw):
        assert drawn == ["0"], "contexts were drawn ahead of the rows"
        parent = prefill(self, *args, **kw)
        os.kill(os.getpid(), signal.SIGTERM)
        return parent

    monkeypatch.setattr(TorchEngine, "prefill", prefill_then_sigterm)
    out = tmp_path / "out"
    assert kvbench("run", *MODEL, *FAST, "--limit", "1000000000", "--out", str(out)) == 143
    err = capsys.readouterr().err
    assert f"interrupted: 0 new rows are saved in {out / 'results.jsonl'}; rerun the same command to resume" in err
    assert "Traceback" not in err and drawn == ["0"] and not out.exists()


def _context(task: str, item: int) -> Context:
    question = Question("0", "q", "", 4, ("a",), ("string_match_all",))
    return Context("b", task, str(item), "instruction", "body", (question,))


def _items(task: str, n: int):
    """A task's contexts, drawn one at a time."""
    return (_context(task, j) for j in range(n))


def test_lazy_contexts_keep_the_shards_and_count_a_task_that_ends_short():
    """The shards of contexts drawn lazily are those of drawing everything first (running index c kept by shard
    c % N); the total counts each task at --limit until it ends short, which is said once (--limit clamped)."""
    tasks = {"t1": 3, "t2": 1, "t3": 3}  # items each task has; --limit 3
    everything = [(t, i) for t, n in tasks.items() for i in range(n)]
    for i in range(3):
        config = RunConfig(methods=["full"], bench="b", ps=[1.0], out=Path("unused"), limit=3, shard=(i, 3))
        console = Console(file=io.StringIO(), width=200)
        shard = ShardContexts(config, [(t, _items(t, n)) for t, n in tasks.items()], console, record=None)
        assert shard.total == 3
        got = [(c.task, int(c.item)) for c in shard]
        assert got == everything[i::3] and shard.total == len(got)
        assert console.file.getvalue().splitlines() == ["b/t2 has 1 items, fewer than --limit 3: it runs them all"]


def test_tasks_missing_their_data_give_a_line_each_and_the_fix_once(tmp_path):
    """Several tasks of a bench without data: each reason on its own line, their shared fix once (it was the whole
    message per task, then all of them again)."""

    @register_bench
    class HalfMissing(Bench):
        name = "test-half-missing-fix"

        def tasks(self):
            return ["ok", "m1", "m2"]

        def contexts(self, task, *, length, limit, seed, prompt_length):
            if task != "ok":
                raise MissingDataError(reason=f"{task}.json not found", fix="set --data-dir")
            return _items(task, 1)

    config = RunConfig(methods=["full"], bench=HalfMissing.name, ps=[1.0], out=tmp_path, limit=1, length=100)
    console, recorded = Console(file=io.StringIO(), width=300), {}
    shard = shard_contexts(config, SimpleNamespace(tokenizer=None), console, lambda t, r: recorded.update({t: r}))
    assert [c.task for c in shard] == ["ok"]
    assert console.file.getvalue().splitlines() == [
        "test-half-missing-fix/m1 is missing its data: m1.json not found",
        "test-half-missing-fix/m2 is missing its data: m2.json not found",
        "to run them: set --data-dir",
    ]
    assert recorded == {"m1": "m1.json not found. Fix: set --data-dir", "m2": "m2.json not found. Fix: set --data-dir"}
