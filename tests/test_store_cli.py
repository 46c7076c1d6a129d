"""Issue 17 through the CLI: every bad input is one unwrapped line and exit 2 with existing files unchanged;
one writer per --out; settings that change an answer get their own rows; quiet defaults."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest
import torch

from kvbench.results.read import read_results
from kvbench.results.store import ResultsStore
from tests.test_cli import kvbench
from tests.test_results import make_row, spawn

MODEL = ("--model", "tiny-random")
FAST = ("--method", "full", "--limit", "1", "--length", "600")  # one context, one row


def _existing(out: Path) -> None:
    """A results directory holding rows, a manifest and a missing-data record."""
    with ResultsStore(out) as store:
        for i in range(3):
            store.append(make_row(i))
        store.write_manifest({"model": "m", "model_fingerprint": "cd" * 32})
        store.record_missing("b", "t2", "absent")


def _snapshot(out: Path) -> dict[str, bytes]:
    """Every file below ``out`` (lock files aside: they hold no results) and its bytes."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and
            not p.name.endswith(".lock")}  # fmt: skip


def _checkpoint_without_weights(tmp: Path) -> None:
    (tmp / "noweights").mkdir()
    (tmp / "noweights" / "config.json").write_text(json.dumps({"model_type": "qwen3_next"}))


def _readonly_results(tmp: Path, monkeypatch) -> None:
    """results.jsonl cannot be opened for writing (root ignores chmod: the open itself is refused)."""
    import kvbench.results.store as results_store

    real = os.open

    def refuse(path, flags, *a):
        if Path(path).name == "results.jsonl" and flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, *a)

    monkeypatch.setattr(results_store.os, "open", refuse)


def _results_is_a_directory(tmp: Path, monkeypatch) -> None:
    path = tmp / "out" / "results.jsonl"
    path.rename(tmp / "out" / "kept.jsonl")
    path.mkdir()


def _no_data(tmp: Path, monkeypatch) -> None:
    (tmp / "empty").mkdir()
    monkeypatch.setenv("KVBENCH_DATA_DIR", str(tmp / "empty"))


def _writer_running(tmp: Path, monkeypatch, request) -> None:
    holder = spawn(tmp / "out", "0/1", "hold")
    request.addfinalizer(lambda: holder.communicate("\n", timeout=60))
    monkeypatch.setenv("HOLDER_PID", str(holder.pid))


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA, so --device cuda is valid")
BAD_INPUTS = [
    (["--dtype", "float33"], "is not one of float32, bfloat16, float16", None),
    pytest.param(["--device", "cuda"], "CUDA is not available", None, marks=NO_CUDA),
    (["--device", "tpu9"], "is not a torch device", None),
    (["--model", "TMP/noweights"], "has config.json but no weights", _checkpoint_without_weights),
    (["--model", "TMP"], "has no config.json", None),
    (["--model", "TMP/out/manifest.json"], "is a file", None),
    (["--threads", "-1"], "--threads -1: need at least 1", None),
    (["--threads", "0"], "--threads 0: need at least 1", None),
    (["--p", "0.5,,0.1"], "empty entry", None),
    (["--p", ""], "empty entry", None),
    (["--p", "0.5,0.1,0.5"], "--p lists 0.5 more than once", None),
    (["--method", "full,random,full"], "--method lists full more than once", None),
    (["--method", "random", "--allocation", "flat,flat"], "--allocation lists flat more than once", None),
    (["--length", "0"], "--length 0: need a positive number", None),
    (["--length", "200000"], "exceeds the 131072 positions", None),
    (["--length", "10"], "nothing to run, no task of needle can run", None),
    (["--bench", "ruler", "--task", "qa_1"], "RULER task qa_1 needs", _no_data),
    (["--engine", "nope"], "valid engines", None),
    ([], "cannot write TMP/out/results.jsonl: Permission denied", _readonly_results),
    ([], "results.jsonl is a directory", _results_is_a_directory),
    ([], "being written by another kvbench run, pid HOLDER_PID", _writer_running),
]


@pytest.mark.parametrize("args, message, setup", BAD_INPUTS)
def test_every_bad_input_exits_2_in_one_line_and_damages_nothing(tmp_path, capsys, monkeypatch, request, args,
                                                                   message, setup):  # fmt: skip
    out = tmp_path / "out"
    _existing(out)
    if setup is not None:
        params = setup.__code__.co_varnames[: setup.__code__.co_argcount]
        setup(*[{"tmp": tmp_path, "monkeypatch": monkeypatch, "request": request}[p] for p in params])
    before = _snapshot(out)
    args = [a.replace("TMP", str(tmp_path)) for a in args]
    code = kvbench("run", *MODEL, *FAST, *args, "--out", str(out))
    err = capsys.readouterr().err
    message = message.replace("TMP", str(tmp_path)).replace("HOLDER_PID", os.environ.get("HOLDER_PID", ""))
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and message in lines[0], err  # one line, not wrapped at 80 columns
    assert _snapshot(out) == before


def test_report_into_a_path_under_a_file_is_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    _existing(out)
    before = _snapshot(out)
    assert kvbench("report", "--results", str(out), "--out", str(out / "manifest.json" / "report")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "cannot write the report" in err and "choose another --out" in err
    assert _snapshot(out) == before


def test_report_reads_without_writing_and_names_what_it_skipped(tmp_path, capsys):
    out = tmp_path / "out"
    _existing(out)
    with open(out / "results.jsonl", "ab") as f:
        f.write(b'{"model": "m", "eng')  # a writer is mid-row
    before = _snapshot(out)
    assert kvbench("report", "--results", str(out), "--out", str(tmp_path / "r")) == 0
    assert "skipped an incomplete last line" in capsys.readouterr().err
    assert _snapshot(out) == before and "| p=0.5 |" in (tmp_path / "r" / "report.md").read_text()


def test_settings_that_change_an_answer_get_their_own_rows(tmp_path, capsys):
    """issue 17 item 1: the same command at another --length, or another --seed, is not "already present"."""
    out = str(tmp_path / "out")
    for extra in ([], ["--length", "700"], ["--seed", "7"]):
        assert kvbench("run", *MODEL, *FAST, *extra, "--out", out) == 0
        assert "1 rows written, 0 already present" in capsys.readouterr().err
    assert kvbench("run", *MODEL, *FAST, "--seed", "7", "--out", out) == 0  # a true rerun still resumes
    assert "0 rows written, 1 already present" in capsys.readouterr().err
    rows = read_results(out).rows
    assert sorted((r["length"], r["seed"]) for r in rows) == [(600, 7), (600, 42), (700, 42)]
    assert len({r["context_sha256"] for r in rows}) == 3 and len({r["model_fingerprint"] for r in rows}) == 1


def test_full_disk_mid_run_exits_2_and_the_rerun_resumes(tmp_path, capsys, monkeypatch):
    import kvbench.results.store as results_store

    out = str(tmp_path / "out")
    real = os.write

    def full(fd, buf):
        if b'"prediction"' in bytes(buf):  # a result row, not the lock file's pid line
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buf)

    monkeypatch.setattr(results_store.os, "write", full)
    assert kvbench("run", *MODEL, *FAST, "--out", out) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"cannot write {out}/results.jsonl: the disk is full" in err
    assert "rerun the same command" in err
    monkeypatch.setattr(results_store.os, "write", real)
    assert kvbench("run", *MODEL, *FAST, "--out", out) == 0
    assert "1 rows written, 0 already present" in capsys.readouterr().err
    assert len(read_results(out).rows) == 1


def test_help_lists_the_choices_of_closed_options(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # a narrow help table would break a choice list over two lines
    assert kvbench("run", "--help") == 0
    text = " ".join(capsys.readouterr().out.split())
    for choices in ("[torch|vllm]", "[float32|bfloat16|float16]", "[flat|pyramid|gate|global]", "[cpu|cuda|"):
        assert choices in text


def test_a_usage_error_is_one_line(capsys):
    assert kvbench("run", "--limit", "many") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'--limit'" in err and "valid integer" in err and "run --help" in err


def test_fallback_kernel_warnings_are_one_short_line_unless_verbose(caplog, monkeypatch):
    """transformers' four "falling back to its reference PyTorch implementation" warnings: one short line."""
    from kvbench.engines.hf_adapters import FALLBACK_SUMMARY, KernelWarningFilter

    logger = logging.getLogger("transformers.integrations.hub_kernels")
    monkeypatch.setattr(logger, "filters", [])  # without the filter an earlier `kvbench` call installed
    quiet = KernelWarningFilter()
    logger.addFilter(quiet)
    try:
        with caplog.at_level(logging.WARNING, logger=logger.name):
            for name in ("causal_conv1d_fn", "chunk_gated_delta_rule", "causal_conv1d_update", "fused_recurrent"):
                logger.warning(f"`{name}` is falling back to its reference PyTorch implementation because ...")
            logger.warning("an unrelated warning")
            quiet.verbose = True
            logger.warning("`x` is falling back to its reference PyTorch implementation because ...")
    finally:
        logger.removeFilter(quiet)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [FALLBACK_SUMMARY, "an unrelated warning", messages[-1]] and messages[-1].startswith("`x`")


def test_the_fingerprint_tells_dtypes_apart():
    from kvbench.models import build_random, fingerprint, tiny_qwen3_next_config

    model = build_random(tiny_qwen3_next_config(), seed=0)
    fp32 = fingerprint(model)
    assert fingerprint(model.to(torch.bfloat16)) != fp32


def test_two_same_command_runs_at_once_leave_each_row_once(tmp_path):
    """The second of two identical `kvbench run`s started together exits 2 naming the first one's pid."""
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    # ten contexts: the first run still holds the lock when the second has started up (~5 s of imports)
    many = ("--method", "full", "--limit", "10", "--length", "900")
    command = [sys.executable, "-m", "kvbench.cli", "run", *MODEL, *many, "--p", "0.5", "--out", str(out)]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = out / "results.jsonl.lock"
    deadline = time.monotonic() + 120
    while not (lock.exists() and str(first.pid) in lock.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    _, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert f"being written by another kvbench run, pid {first.pid} " in second.stderr
    rows = read_results(out).rows
    assert len(rows) == 10 and len((out / "results.jsonl").read_text().splitlines()) == 10
