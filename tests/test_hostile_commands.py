"""Issue 67: the commands added after ``kvbench run`` held to its standard. ``kvbench data fetch`` records only files
the benches can use; a bench whose data holds no usable item ends with exit 2 naming the file; a plugin that raises
or exits on import is one line naming it (the other commands still work, nothing exits 0 having done nothing); a
plugin clash names its ``pip uninstall``; ``kvbench list`` alone lists everything; OS errors are one line naming
the path; ``kvbench train-tiny`` checks every option before any work."""

from __future__ import annotations

import errno
import json
import os
import socket
from pathlib import Path

import pytest

from kvbench.methods import METHODS
from kvbench.tasks import Bench, register_bench
from tests.test_cli import kvbench
from tests.test_data_fetch import FIXTURES, HUB, RESOLVE, _sha, sources  # noqa: F401 (sources: a fixture)
from tests.test_registry import KEYNORM, write_dist
from tests.test_store_cli import MODEL

FAST = ("--method", "full", "--limit", "1", "--length", "600", "--threads", "1")


def _one_error(err: str) -> str:
    """The only error line of ``err`` (asserting there is one and no traceback)."""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _recorded(root: Path) -> dict:
    record = root / "kvbench-fetch.json"
    return json.loads(record.read_text())["files"] if record.is_file() else {}


# --- kvbench data fetch ----------------------------------------------------------------------------------------

SQUAD = (FIXTURES / "ruler" / "squad.json").read_bytes()


@pytest.mark.parametrize(
    "path, body, reason",
    [
        ("/qa/squad.json", SQUAD[: len(SQUAD) // 2], "cannot use ("),  # cut, the length header agreeing
        ("/qa/hotpot.json", b"[]", "holds no answerable question"),
        ("/qa/hotpot.json", b"", "the file is empty"),
        ("/qa/squad.json", b'{"data": []}', "holds no answerable question"),
    ],
)
def test_a_cut_or_empty_download_is_refused_never_recorded(sources, tmp_path, capsys, path, body, reason):  # noqa: F811
    server, _ = sources
    server.files[path] = body
    root = tmp_path / "data"
    assert kvbench("data", "fetch", "ruler", "--data-dir", str(root)) == 2
    line = _one_error(capsys.readouterr().err)
    assert path in line and reason in line and "nothing was kept" in line, line
    rel = "ruler/squad.json" if "squad" in path else "ruler/hotpotqa.json"
    assert not (root / rel).exists() and not (root / f"{rel}.part").exists()
    assert rel not in _recorded(root)


def test_a_file_already_there_is_checked_before_it_is_recorded(sources, tmp_path, capsys):  # noqa: F811
    server, expected = sources
    root = tmp_path / "data"
    (root / "ruler").mkdir(parents=True)
    (root / "ruler" / "hotpotqa.json").write_text("[]")  # what the fetch recorded as fetched
    assert kvbench("data", "fetch", "ruler", "--data-dir", str(root)) == 2
    line = _one_error(capsys.readouterr().err)
    assert f"{root / 'ruler' / 'hotpotqa.json'} is there but the benches cannot use it" in line, line
    assert "holds no answerable question" in line and "remove it and rerun" in line
    assert "ruler/hotpotqa.json" not in _recorded(root)
    # removed as told, it is fetched; then cut behind the fetch's back, the record's size catches it
    (root / "ruler" / "hotpotqa.json").unlink()
    assert kvbench("data", "fetch", "ruler", "--data-dir", str(root)) == 0, capsys.readouterr().err
    assert _recorded(root)["ruler/hotpotqa.json"]["bytes"] == len(expected["ruler/hotpotqa.json"])
    os.truncate(root / "ruler" / "squad.json", 100)
    assert kvbench("data", "fetch", "ruler", "--data-dir", str(root)) == 2
    assert "100 bytes, not the" in _one_error(capsys.readouterr().err)


def test_a_hub_file_without_rows_is_refused(sources, tmp_path, capsys):  # noqa: F811
    """A parquet file of the right schema and sha256 but no row (the hub's listing agreeing) is not recorded."""
    import pyarrow.parquet as pq

    server, _ = sources
    tree = json.loads(server.files[HUB])
    entry = tree[0]
    schema = pq.read_schema(FIXTURES / "scbench" / entry["path"])
    empty = tmp_path / "empty.parquet"
    pq.write_table(schema.empty_table(), empty)
    data = empty.read_bytes()
    entry.update(size=len(data), lfs={"oid": _sha(data), "size": len(data), "pointerSize": 134})
    server.files[HUB] = json.dumps(tree).encode()
    server.files[RESOLVE + entry["path"]] = data
    root = tmp_path / "data"
    assert kvbench("data", "fetch", "scbench", "--data-dir", str(root)) == 2
    line = _one_error(capsys.readouterr().err)
    assert "holds no row" in line and entry["path"] in line, line
    assert not (root / "scbench" / entry["path"]).exists() and f"scbench/{entry['path']}" not in _recorded(root)


def test_a_data_directory_that_cannot_be_written_is_one_line(sources, tmp_path, capsys, monkeypatch):  # noqa: F811
    # a file where the directory should be: the OS refuses, for root too
    (tmp_path / "afile").write_text("x")
    assert kvbench("data", "fetch", "ruler", "--data-dir", str(tmp_path / "afile" / "data")) == 2
    line = _one_error(capsys.readouterr().err)
    assert f"--data-dir {tmp_path / 'afile' / 'data'}: {tmp_path / 'afile'} is a file" in line, line
    # a read-only directory (what a non-root user gets from chmod 0555; root is let through, so it is simulated
    # where the traceback came from: the temporary file beside the record)
    import tempfile

    def refused(*args, dir=None, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(Path(dir) / ".tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    root = tmp_path / "data"
    assert kvbench("data", "fetch", "ruler", "--data-dir", str(root)) == 2
    line = _one_error(capsys.readouterr().err)
    assert "Permission denied" in line and str(root) in line and "make" in line and "writable" in line, line


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_offline_names_every_unreachable_source(tmp_path, monkeypatch, capsys):
    dead = [f"http://127.0.0.1:{_closed_port()}" for _ in range(4)]
    urls = {"KVBENCH_RULER_ESSAY_URLS": f"{dead[0]}/list.txt", "KVBENCH_SQUAD_URL": f"{dead[1]}/squad.json",
            "KVBENCH_HOTPOTQA_URL": f"{dead[2]}/hotpot.json", "KVBENCH_HUB_ENDPOINT": dead[3]}  # fmt: skip
    for env, url in urls.items():
        monkeypatch.setenv(env, url)
    assert kvbench("data", "fetch", "all", "--data-dir", str(tmp_path / "data")) == 2
    line = _one_error(capsys.readouterr().err)
    assert all(f"cannot reach {url} (" in line for url in urls.values()), line
    assert not (tmp_path / "data").exists()


# --- a bench whose data holds no usable context -----------------------------------------------------------------


@pytest.mark.parametrize(
    "rel, content, task, reason",
    [
        ("ruler/hotpotqa.json", "[]", "qa_2", "holds no answerable question"),
        ("ruler/squad.json", SQUAD[:500].decode(), "qa_1", "cannot read RULER data file"),
        ("scbench/scbench_kv/test.jsonl", "\n", "kv", "holds no row"),
    ],
)
def test_a_bench_without_a_usable_context_ends_with_exit_2_naming_the_file(tmp_path, capsys, rel, content, task,
                                                                            reason):  # fmt: skip
    data = tmp_path / "data"
    (data / rel).parent.mkdir(parents=True)
    (data / rel).write_text(content)
    bench = rel.split("/")[0]
    out = tmp_path / "out"
    args = ["run", *MODEL, *FAST, "--bench", bench, "--task", task, "--data-dir", str(data), "--out", str(out)]
    assert kvbench(*args) == 2
    line = _one_error(capsys.readouterr().err)
    assert str(data / rel) in line and reason in line and "kvbench data fetch" in line, line
    assert not out.exists()


class NoItems(Bench):
    """A bench whose data holds nothing (the generic check, for a bench that says nothing itself)."""

    name = "test-no-items"

    def tasks(self):
        return ["a"]

    def contexts(self, task, *, length, limit, seed, prompt_length):
        return iter(())


@pytest.mark.parametrize("named", [True, False])
def test_a_bench_yielding_no_context_is_not_a_success(tmp_path, capsys, named):
    from kvbench.tasks import BENCHES

    if "test-no-items" not in BENCHES:
        register_bench(NoItems)
    out = tmp_path / "out"
    task = ["--task", "a"] if named else []
    assert kvbench("run", *MODEL, *FAST, "--bench", "test-no-items", *task, "--out", str(out)) == 2
    line = _one_error(capsys.readouterr().err)
    assert "test-no-items/a gives no context: its data holds no usable item" in line, line
    assert not out.exists()


# --- plugins ------------------------------------------------------------------------------------------------------


@pytest.fixture
def broken_plugin(tmp_path, monkeypatch):
    """Installs (on the path) ``exitplug`` whose method ``exiter`` calls sys.exit(0) on import and ``raiseplug``
    whose method ``raiser`` raises; both read as entry points by a fresh look at the method registry."""
    site = tmp_path / "site"
    write_dist(site, "exitplug", {"kvbench.methods": {"exiter": "exitplug:Exiter"}},
               {"exitplug.py": "import sys\nsys.exit(0)\n"})  # fmt: skip
    write_dist(site, "raiseplug", {"kvbench.methods": {"raiser": "raiseplug:Raiser"}},
               {"raiseplug.py": "raise RuntimeError('boom\\nsecond line')\n"})  # fmt: skip
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(METHODS, "_entry_points", None)
    return site


@pytest.mark.parametrize("method, dist, what", [("exiter", "exitplug", "it called sys.exit(0)"),
                                                ("raiser", "raiseplug", "RuntimeError: boom second line")])  # fmt: skip
def test_a_plugin_that_exits_or_raises_on_import_is_one_line(broken_plugin, tmp_path, capsys, method, dist, what):
    out = tmp_path / "out"
    assert kvbench("run", *MODEL, *FAST, "--method", method, "--bench", "needle", "--out", str(out)) == 2
    line = _one_error(capsys.readouterr().err)
    assert f"entry point '{method}' (entry point {dist}:" in line and f"(dist {dist} 0.1)" in line, line
    assert what in line and f"`pip uninstall {dist}`" in line, line
    assert not out.exists()


def test_the_other_commands_work_beside_a_broken_plugin(broken_plugin, capsys):
    assert kvbench("list", "benches") == 0
    assert "needle" in capsys.readouterr().out
    assert kvbench("list", "methods") == 2  # every other method listed, then the broken ones in one line
    captured = capsys.readouterr()
    assert "snapkv" in captured.out and "gatesight" in captured.out
    line = _one_error(captured.err)
    assert "'exiter'" in line and "'raiser'" in line and "pip uninstall exitplug" in line, line


def test_a_command_plugin_that_exits_on_import_is_one_line(tmp_path, monkeypatch, capsys):
    from kvbench.commands import COMMANDS

    site = write_dist(tmp_path / "site", "cmdplug", {"kvbench.commands": {"mycmd": "cmdplug:app"}},
                      {"cmdplug.py": "import sys\nsys.exit(0)\n"})  # fmt: skip
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(COMMANDS, "_entry_points", None)
    assert kvbench("mycmd", "--help") == 2
    line = _one_error(capsys.readouterr().err)
    assert "entry point 'mycmd' (entry point cmdplug:app (dist cmdplug 0.1))" in line, line
    assert "it called sys.exit(0)" in line and "`pip uninstall cmdplug`" in line, line
    assert kvbench("list", "engines") == 0 and "torch" in capsys.readouterr().out  # the others still work


def test_a_plugin_clash_names_the_pip_uninstall_that_fixes_it(tmp_path, monkeypatch, capsys):
    site = write_dist(tmp_path / "site", "myplugin", {"kvbench.methods": {"snapkv": "myplugin:KeyNorm"}},
                      {"myplugin/__init__.py": KEYNORM})  # fmt: skip
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(METHODS, "_entry_points", None)
    assert kvbench("list", "methods") == 2
    line = _one_error(capsys.readouterr().err)
    assert "method 'snapkv' is already registered by built-in" in line and "`pip uninstall myplugin` fixes it" in line


def test_sys_exit_0_inside_a_command_is_not_a_success(monkeypatch, capsys):
    from kvbench import cli

    def exits(obj):
        raise SystemExit(0)

    monkeypatch.setattr(cli, "_first_line", exits)
    assert kvbench("list", "allocations") == 2
    line = _one_error(capsys.readouterr().err)
    assert "test_hostile_commands.py:" in line and "called sys.exit(0) before the command finished" in line, line


def test_list_without_an_argument_lists_everything(capsys):
    assert kvbench("list") == 0
    out = capsys.readouterr().out
    kinds = [("methods", "snapkv"), ("benches", "ruler"), ("models", "tiny-trained"), ("allocations", "pyramid"),
             ("engines", "torch"), ("scorers", "string_match_all")]  # fmt: skip
    for kind, example in kinds:
        assert f"\n{kind}\n" in f"\n{out}" and example in out, kind


def test_an_os_error_no_command_handles_is_one_line(monkeypatch, capsys):
    from kvbench import cli

    def unreadable(obj):
        raise PermissionError(errno.EACCES, "Permission denied", "/some/file")

    monkeypatch.setattr(cli, "_first_line", unreadable)
    assert kvbench("list", "allocations") == 2
    line = _one_error(capsys.readouterr().err)
    assert line == ("error: cannot use /some/file (Permission denied); make it writable (or readable) for this user, "
                    "or choose another path"), line  # fmt: skip


# --- kvbench train-tiny: every option checked before any work ---------------------------------------------------

BAD_TRAIN_ARGS = [
    (["--threads", "-1"], "--threads -1: need at least 1"),
    (["--threads", "0"], "--threads 0: need at least 1"),
    (["--threads", "1000"], "--threads 1000 exceeds the"),
    (["--steps", "0"], "--steps 0: need at least 1"),
    (["--steps", "-5"], "--steps -5: need at least 1"),
    (["--seed", "-1"], "--seed -1: need an integer from 0 to 4294967295"),
    (["--seed", str(2**32)], f"--seed {2**32}: need an integer from 0"),
    (["--batch-size", "0"], "--batch-size 0: need at least 1"),
    (["--lr", "nan"], "--lr nan: need a positive learning rate"),
    (["--lr", "0"], "--lr 0.0: need a positive learning rate"),
    (["--save-every", "0"], "--save-every 0: need at least 1"),
    (["--eval-limit", "-1"], "--eval-limit -1: need at least 0"),
    (["--warmup", "-3"], "--warmup -3: must be at least 0"),
    (["--steps", "10", "--warmup", "10"], "--warmup 10: must be at least 0 and below --steps (10)"),
    (["--curriculum", "99999999@0"], "row length 99999999 is outside 128 to 8192"),
    (["--curriculum", "16@0"], "row length 16 is outside 128 to 8192"),
    (["--curriculum", "128@0,256@1.5"], "start fraction 1.5 is outside [0, 1)"),
    (["--curriculum", "256@0.1"], "the first stage must start at 0"),
    (["--mix", "recall=nan"], "weights must be finite"),
    (["--mix", "nope=1"], "unknown task(s)"),
    (["--arch", "bogus"], "--arch 'bogus': valid architectures are"),
    (["--init", "TMP/missing"], "--init TMP/missing: no trained model there"),
    (["--card-note", "TMP/note.md"], "--card-note only applies to an export"),
]


@pytest.mark.parametrize("args, message", BAD_TRAIN_ARGS)
def test_train_tiny_refuses_bad_options_before_any_work(tmp_path, capsys, monkeypatch, args, message):
    import kvbench_training

    monkeypatch.setattr(kvbench_training, "train", lambda *a, **k: pytest.fail("training started"))
    args = [a.replace("TMP", str(tmp_path)) for a in args]
    out = tmp_path / "out"
    assert kvbench("train-tiny", "--out", str(out), *args) == 2
    line = _one_error(capsys.readouterr().err)
    assert message.replace("TMP", str(tmp_path)) in line, line
    assert not out.exists()


def test_train_tiny_refuses_an_out_it_cannot_write_before_any_work(tmp_path, capsys, monkeypatch):
    import kvbench_training

    monkeypatch.setattr(kvbench_training, "train", lambda *a, **k: pytest.fail("training started"))
    (tmp_path / "afile").write_text("x")
    assert kvbench("train-tiny", "--out", str(tmp_path / "afile" / "run"), "--steps", "2") == 2
    line = _one_error(capsys.readouterr().err)
    assert f"--out {tmp_path / 'afile' / 'run'}: {tmp_path / 'afile'} is a file, not a folder" in line, line
