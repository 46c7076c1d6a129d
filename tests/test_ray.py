"""``kvbench run --ray``: option handling without Ray, and on a local 2-worker Ray: the rows equal a
single-process run, and a worker SIGKILLed mid-run leaves every row exactly once."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest

from kvbench import cli
from kvbench.distributed import (
    RayOptions,
    ShardProgress,
    _ProgressHub,
    _summarize,
    check_options,
    describe,
    run_ray,
    shard_configs,
)
from kvbench.errors import KvbenchError
from kvbench.results.keys import ROW_KEY
from kvbench.run.plan import RunConfig, RunSummary

from .test_cli import kvbench

# how a row was computed, not what: timings and the size of the decode it came from (a single process pools the
# contexts that two shards answer apart)
TIMINGS = ("prefill_s", "score_s", "fork_s", "answer_s", "answer_batch")
RUN = ("run", "--model", "tiny-random", "--bench", "needle", "--length", "900", "--threads", "1")
NEEDS_RAY = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason='Ray is an optional extra: pip install -e ".[ray]" (CI installs it)',
)


def rows_of(out: Path) -> list[dict]:
    """Every row of every results file in ``out`` (one file, or one per shard)."""
    return [json.loads(line) for f in sorted(out.glob("results*.jsonl")) for line in f.read_text().splitlines()]


def key(row: dict) -> tuple:
    return tuple(row[k] for k in ROW_KEY)


def without_timings(rows: list[dict]) -> dict[tuple, dict]:
    return {key(r): {k: v for k, v in r.items() if k not in TIMINGS} for r in rows}


def four_contexts(out: Path) -> RunConfig:
    """needle, ``full`` only: 4 contexts of one question each (2 per shard with 2 workers), each context's row
    written as soon as it is answered (``answer_contexts=1``: a kill lands between two contexts' rows)."""
    return RunConfig(
        methods=["full"],
        bench="needle",
        ps=[1.0],
        out=out,
        model="tiny-random",
        limit=4,
        length=900,
        threads=1,
        answer_contexts=1,
    )


def shard_1_killer(killed: list[int]):
    """An ``on_poll`` that SIGKILLs shard 1's worker once, after its first context, appending its pid to
    ``killed``."""

    def kill(progress):
        state = progress.get(1)
        if not killed and state and state.total and 1 <= state.done < state.total:
            os.kill(state.pid, signal.SIGKILL)
            killed.append(state.pid)

    return kill


def test_bare_ray_means_a_local_ray():
    bare = cli._bare_option
    assert bare(["run", "--ray"], "--ray", "local") == ["run", "--ray", "local"]
    assert bare(["run", "--ray", "--workers", "2"], "--ray", "local") == ["run", "--ray", "local", "--workers", "2"]
    assert bare(["run", "--ray", "auto", "-n", "2"], "--ray", "local") == ["run", "--ray", "auto", "-n", "2"]
    assert bare(["run", "--ray=ray://h:10001"], "--ray", "local") == ["run", "--ray=ray://h:10001"]
    assert bare(["run", "--limit", "2"], "--ray", "local") == ["run", "--limit", "2"]


def test_without_ray_installed_exits_2_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as when it is not installed
    out = tmp_path / "run"
    assert kvbench(*RUN, "--method", "full", "--limit", "1", "--ray", "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert 'pip install -e ".[ray]"' in err and "Traceback" not in err
    assert not rows_of(out)


@pytest.mark.parametrize(
    "args, words",
    [
        (("--ray", "--workers", "0"), "--workers 0"),
        (("--ray", "--shard", "1/2"), "drop --shard"),
        (("--ray", "--gpus-per-worker", "1"), "--device cuda"),
        (("--ray", "--device", "cuda"), "--gpus-per-worker 1"),
        (("--ray", "--device", "cuda:1", "--gpus-per-worker", "1"), "use --device cuda"),
        (("--ray", "--gpus-per-worker", "2", "--device", "cuda"), "use 1 or less"),
        (("--ray", "--gpus-per-worker", "-1"), "need 0 or more"),
        (("--workers", "2"), "add --ray"),
        (("--ray", "--method", "nosuch"), "nosuch"),
    ],
)
def test_bad_ray_options_exit_2_before_ray_starts(tmp_path, capsys, args, words):
    out = tmp_path / "run"
    assert kvbench(*RUN, "--method", "full", "--limit", "1", *args, "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert not rows_of(out)
    if "ray" in sys.modules and sys.modules["ray"] is not None:
        assert not sys.modules["ray"].is_initialized()


def test_shard_configs_cover_every_shard_once_with_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    config = RunConfig(methods=["full"], bench="needle", ps=[0.5], out=Path("rel/out"), model="m")
    shards = shard_configs(config, 3)
    assert [c.shard for c in shards] == [(0, 3), (1, 3), (2, 3)]
    assert all(c.out == tmp_path / "rel" / "out" and c.model == str(tmp_path / "m") for c in shards)
    with pytest.raises(KvbenchError, match="drop --shard"):
        check_options(shards[1], RayOptions())


@NEEDS_RAY
@pytest.mark.slow
def test_ray_rows_equal_a_single_process_run(tmp_path, capsys):
    args = (*RUN, "--method", "full,random", "--p", "0.5", "--limit", "2")
    single, ray = tmp_path / "single", tmp_path / "ray"
    assert kvbench(*args, "--out", str(single)) == 0, capsys.readouterr().err
    assert kvbench(*args, "--ray", "--workers", "2", "--out", str(ray)) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "4 rows written, 0 already present, 2 contexts in 2 of 2 shards" in err.replace("\n", " ")
    single_rows, ray_rows = rows_of(single), rows_of(ray)
    assert len(single_rows) == 4 and len(ray_rows) == 4
    assert without_timings(ray_rows) == without_timings(single_rows)
    runs = json.loads((ray / "manifest.json").read_text())["runs"]
    assert sorted(tuple(r["config"]["shard"]) for r in runs) == [(0, 2), (1, 2)]


@NEEDS_RAY
@pytest.mark.slow
def test_a_worker_killed_mid_run_still_gives_every_row_once(tmp_path):
    out = tmp_path / "ray"
    killed: list[int] = []
    summary = run_ray(four_contexts(out), RayOptions(workers=2), on_poll=shard_1_killer(killed))
    assert killed, "shard 1 finished before it could be killed: the test did not test a kill"
    assert summary.failed == {} and summary.retries == {1: 1}
    rows = rows_of(out)
    counts = Counter(key(r) for r in rows)
    assert all(n == 1 for n in counts.values()), [k for k, n in counts.items() if n > 1]
    assert sorted(int(r["item"]) for r in rows) == [0, 1, 2, 3]  # needle: one question per context
    # the retry skipped the one context its killed predecessor had finished
    assert (summary.rows_written, summary.rows_skipped) == (3, 1)


@NEEDS_RAY
@pytest.mark.slow
def test_an_input_error_inside_a_shard_exits_2_and_stops_every_shard(tmp_path, capsys):
    # test-keynorm is registered in this process (tests/test_cli.py) but not in the workers: the driver's
    # checks pass and each worker's runner refuses it, as with a method plugin installed on the head node only
    out = tmp_path / "ray"
    assert kvbench(*RUN, "--method", "test-keynorm", "--p", "0.5", "--limit", "2", "--ray", "--out", str(out)) == 2
    err = capsys.readouterr().err
    # Ray's own start-up log line may fail to reach an earlier test's (closed) capture, and Python's logging
    # then prints "--- Logging error ---" with a traceback: that report is pytest's, not kvbench's
    own = err.split("--- Logging error ---")[0] + err.rsplit("Arguments: ()", 1)[-1]
    assert "test-keynorm" in own and "Traceback" not in own
    assert not rows_of(out)


@NEEDS_RAY
@pytest.mark.slow
def test_a_shard_out_of_retries_is_reported_and_the_rerun_resumes_it(tmp_path):
    out = tmp_path / "ray"
    killed: list[int] = []
    first = run_ray(four_contexts(out), RayOptions(workers=2, max_retries=0), on_poll=shard_1_killer(killed))
    assert killed and list(first.failed) == [1] and "shard 1/2 failed" in " ".join(describe(first, out))
    done = Counter(key(r) for r in rows_of(out))
    assert len(done) == 3 and set(done.values()) == {1}  # shard 0's two contexts and shard 1's first
    second = run_ray(four_contexts(out), RayOptions(workers=2))
    assert second.failed == {} and (second.rows_written, second.rows_skipped) == (1, 3)
    counts = Counter(key(r) for r in rows_of(out))
    assert len(counts) == 4 and set(counts.values()) == {1}


def test_progress_hub_counts_attempts_and_drops_late_reports_of_a_dead_attempt():
    hub = _ProgressHub()
    hub.report(1, "a", 100, 0, None)
    hub.report(1, "a", 100, 1, 3)
    hub.report(0, "x", 200, 2, 2)
    hub.report(1, "b", 101, 0, 3)  # the retry
    hub.report(1, "a", 100, 2, 3)  # a report the dead attempt sent before it died, arriving late
    hub.report(1, "b", 101, 1, 3)
    snap = hub.snapshot()
    assert snap[0] == ShardProgress(attempts=1, attempt="x", pid=200, done=2, total=2)
    assert snap[1] == ShardProgress(attempts=2, attempt="b", pid=101, done=1, total=3)


def test_summary_adds_up_the_shards_and_names_retried_and_failed_ones(tmp_path):
    results = {0: RunSummary(rows_written=3, rows_skipped=1, contexts=2), 2: RunSummary(rows_written=1, contexts=1)}
    state = {0: ShardProgress(attempts=1), 1: ShardProgress(attempts=1), 2: ShardProgress(attempts=3)}
    summary = _summarize(results, {1: "WorkerCrashedError: died"}, state, 3)
    assert (summary.rows_written, summary.rows_skipped, summary.contexts) == (4, 1, 3)
    assert summary.retries == {2: 2} and summary.failed == {1: "WorkerCrashedError: died"}
    lines = describe(summary, tmp_path)
    assert "4 rows written, 1 already present, 3 contexts in 2 of 3 shards" in lines[0]
    assert "shard 2/3 was retried 2 time(s)" in lines[1] and "shard 1/3 failed: WorkerCrashedError" in lines[2]
