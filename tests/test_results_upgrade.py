"""`kvbench results upgrade`: rows of the previous release lacking only artifact_sha256 get null when their method
reads no artifact; every other old row, a duplicate and an incomplete last line leave the file, whose original
bytes are saved first. Checked against the rows as written and against what the writer and reader then accept."""

import json
import os

import pytest
from typer.testing import CliRunner

from kvbench.methods import declares_no_artifact, get_method, list_methods
from kvbench.results.cli import app
from kvbench.results.keys import ResultsError, row_key
from kvbench.results.read import read_results
from kvbench.results.store import ResultsStore
from kvbench.results.upgrade import upgrade_results
from tests.test_results import make_row


def old(row: dict, *drop: str) -> dict:
    """``row`` as an older kvbench wrote it: without ``drop`` (default: artifact_sha256)."""
    return {k: v for k, v in row.items() if k not in (drop or ("artifact_sha256",))}


def line(row: dict) -> bytes:
    return (json.dumps(row) + "\n").encode()


@pytest.fixture
def old_dir(tmp_path):
    """A directory of a current row, and old rows of every kind, in results.jsonl, plus one shard file."""
    with ResultsStore(tmp_path, (1, 2)) as shard:
        shard.append(make_row(50))  # a current row of another file of the directory
    rows = {
        "current": make_row(0),
        "snapkv": old(make_row(1)),
        "keydiff": old(make_row(2, method="keydiff", score=12.5)),
        "gatesight": old(make_row(3, method="gatesight")),
        "triattention": old(make_row(4, method="triattention")),
        "third_party": old(make_row(5, method="not-installed-here")),
        "older": old(make_row(6), "artifact_sha256", "context_sha256"),
        "duplicate": old(make_row(50)),  # once upgraded, the shard's current row
    }
    data = b"".join(line(r) for r in rows.values()) + b'{"model": "m", "engine'  # a run cut mid-write
    (tmp_path / "results.jsonl").write_bytes(data)
    return tmp_path, rows, data


def test_declares_no_artifact_agrees_with_every_method_instance():
    """The class-level answer equals what an instance reports; GateSight and TriAttention read artifacts."""
    for name in list_methods():
        if declares_no_artifact(name):
            assert get_method(name).artifact_sha256("ab" * 32) is None, name
    assert not declares_no_artifact("gatesight") and not declares_no_artifact("triattention")
    assert all(declares_no_artifact(n) for n in ("full", "random", "snapkv", "keydiff", "kvzip", "oracle"))
    assert not declares_no_artifact("not-installed-here")
    tri = get_method("triattention", options={"mlr": "false"})  # rows record the label, options included
    assert tri.label == "triattention[mlr=false]" and not declares_no_artifact(tri.label)
    assert declares_no_artifact("snapkv[window=16]")  # a label of an artifact-free class


def test_upgrade_keeps_what_is_certain_and_saves_the_original(old_dir):
    tmp_path, rows, data = old_dir
    path = tmp_path / "results.jsonl"
    ups = {u.path.name: u for u in upgrade_results(tmp_path, declares_no_artifact)}
    shard, up = ups["results.shard-1-of-2.jsonl"], ups["results.jsonl"]
    assert not shard.changed and shard.backup is None and shard.current == 1
    assert (up.current, up.upgraded) == (1, 2)
    assert sum(up.left_out.values()) == 6 and up.left_out["a duplicate of a row already in the directory"] == 1
    assert sum(n for r, n in up.left_out.items() if "calibration artifact" in r) == 3  # gatesight, tri, 3rd party
    assert up.left_out["the row lacks context_sha256, artifact_sha256"] == 1
    assert up.left_out["an incomplete last line (a run stopped mid-write)"] == 1
    assert up.backup.read_bytes() == data and up.backup.name.startswith("results.jsonl.pre-upgrade-")
    new = path.read_bytes().splitlines(keepends=True)
    assert new[0] == line(rows["current"])  # byte for byte
    assert [json.loads(x) for x in new[1:]] == [rows["snapkv"] | {"artifact_sha256": None},
                                                rows["keydiff"] | {"artifact_sha256": None}]  # fmt: skip
    # the writer now resumes into the directory, and the reader includes every kept row without a note
    with ResultsStore(tmp_path) as store:
        assert store.is_done(make_row(1)) and store.is_done(make_row(2, method="keydiff"))
        assert not store.is_done(make_row(3, method="gatesight", artifact_sha256=None))
        store.append(make_row(3, method="gatesight", artifact_sha256="ee" * 32))
    read = read_results(tmp_path)
    assert read.notes == [] and sorted(r["item"] for r in read.rows) == [0, 1, 2, 3, 50]
    again = {u.path.name: u for u in upgrade_results(tmp_path, declares_no_artifact)}
    assert not any(u.changed for u in again.values())  # idempotent
    assert sorted(p.name for p in tmp_path.glob("results.jsonl.pre-upgrade-*")) == [up.backup.name]


def test_dry_run_writes_nothing(old_dir):
    tmp_path, _, data = old_dir
    before = sorted(os.listdir(tmp_path))
    (up,) = [u for u in upgrade_results(tmp_path, declares_no_artifact, dry_run=True) if u.changed]
    assert up.upgraded == 2 and up.backup is None
    assert (tmp_path / "results.jsonl").read_bytes() == data and sorted(os.listdir(tmp_path)) == before


def test_refuses_while_a_run_writes_and_on_corruption(tmp_path):
    path = tmp_path / "results.jsonl"
    with ResultsStore(tmp_path, (1, 2)) as writer:
        writer.append(make_row(9))
        path.write_bytes(line(old(make_row(1))))
        with pytest.raises(ResultsError, match=f"being written by pid {os.getpid()}"):
            upgrade_results(tmp_path, declares_no_artifact)
    corrupt = line(old(make_row(1))) + b"not json\n" + line(old(make_row(2)))
    path.write_bytes(corrupt)
    with pytest.raises(ResultsError, match="line 2 is not a valid result row; the file was not modified"):
        upgrade_results(tmp_path, declares_no_artifact)
    assert path.read_bytes() == corrupt and not list(tmp_path.glob("*.pre-upgrade-*"))
    with pytest.raises(ResultsError, match="is not a results directory"):
        upgrade_results(path, declares_no_artifact)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResultsError, match="no results files"):
        upgrade_results(tmp_path / "empty", declares_no_artifact)


def test_upgraded_rows_duplicated_across_files_are_kept_once(tmp_path):
    """The same old row in two shard files: the first file keeps it, the second removes it."""
    row = old(make_row(1))
    for name in ("results.shard-0-of-2.jsonl", "results.shard-1-of-2.jsonl"):
        (tmp_path / name).write_bytes(line(row))
    ups = upgrade_results(tmp_path, declares_no_artifact)
    assert [u.upgraded for u in ups] == [1, 0] and sum(ups[1].left_out.values()) == 1
    assert [row_key(r) for r in read_results(tmp_path).rows] == [row_key(row | {"artifact_sha256": None})]


def test_cli_reports_each_file(old_dir):
    tmp_path, _, _ = old_dir
    result = CliRunner().invoke(app, ["upgrade", str(tmp_path), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "would upgrade 2" in result.output and "would remove 1: an incomplete last line" in result.output
    assert "all current; nothing to do" in result.output
    result = CliRunner().invoke(app, ["upgrade", str(tmp_path)])
    assert result.exit_code == 0 and "upgraded 2" in result.output and "original saved as" in result.output


def test_an_old_row_holding_nan_is_left_out_with_its_reason(tmp_path):
    """An older kvbench may have stored NaN (readers accept it); the store refuses to write it, so the upgrade
    leaves such a row out, says why, and upgrades the others (it used to crash with a bare ValueError)."""
    nan_row = old(make_row(1, score=float("nan")))
    inf_row = old(make_row(2, score=float("inf")))
    fine = old(make_row(3))
    (tmp_path / "results.jsonl").write_bytes(b"".join(line(r) for r in (nan_row, inf_row, fine)))
    for dry_run in (True, False):
        (report,) = upgrade_results(tmp_path, declares_no_artifact, dry_run=dry_run)
        assert report.upgraded == 1
        assert report.left_out == {"the row holds NaN or Infinity, which the results store does not write": 2}
    assert [r["item"] for r in read_results(tmp_path).rows] == [fine["item"]]
