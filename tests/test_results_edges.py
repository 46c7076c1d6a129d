"""Edges of the results store that the round-trip tests do not reach: the report's parallel reading (file_spans cut at
line starts, iter_file over spans, FileStats summed, the whole-file line number of a corrupt line in a later span),
which lines are legacy rows, every error message in full, the lock's holder and discard, the missing.json and
upgrade file formats, and the row schema's field declarations. Each check is against a definition worked by hand or
by brute force, not against the code's own output."""

from __future__ import annotations

import gc
import json
import os
import re
import stat
import sys
import threading
from dataclasses import MISSING
from pathlib import Path

import pytest

import kvbench.results.lock as results_lock
import kvbench.results.scan as results_scan
import kvbench.results.store as results_store
import kvbench.results.upgrade as results_upgrade
from kvbench.methods import declares_no_artifact
from kvbench.results.io import atomic_write, read_file_bytes, read_json
from kvbench.results.keys import ROW_KEY, ResultsError, row_key
from kvbench.results.lock import ResultsLock, check_results_file
from kvbench.results.read import FileStats, file_spans, iter_file, read_results
from kvbench.results.store import ResultsStore
from kvbench.results.upgrade import upgrade_results
from kvbench.rows import Absent, RowKey, _field
from tests.test_results import make_row

NEW = "length, seed, context_sha256, model_fingerprint, artifact_sha256"  # the key fields added after the first rows


def line(row: dict) -> bytes:
    return (json.dumps(row, ensure_ascii=False) + "\n").encode()


def exact(message: str) -> str:
    """A regex matching exactly ``message``."""
    return "^" + re.escape(message) + "$"


def raises_exactly(message: str):
    """``pytest.raises`` of a :class:`ResultsError` whose message is exactly ``message``."""
    return pytest.raises(ResultsError, match=exact(message))


def without(row: dict, *drop: str) -> dict:
    return {k: v for k, v in row.items() if k not in drop}


# --- file_spans: line-aligned byte ranges -------------------------------------------------------------------


def spans_by_definition(data: bytes, size: int, parts: int) -> list[tuple[int, int]]:
    """The documented cuts: for k in 1..parts-1, the first line start (0, or just after a newline) at or after
    max(previous cut, size*k//parts), kept only when strictly between the previous cut and ``size``."""
    starts = [0] + [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
    cuts = [0]
    for k in range(1, parts):
        at = max(cuts[-1], size * k // parts)
        cut = min((s for s in starts if s >= at), default=len(data) + 1)
        if cuts[-1] < cut < size:
            cuts.append(cut)
    return [(cuts[i], cuts[i + 1] if i + 1 < len(cuts) else size) for i in range(len(cuts))]


FILES = [
    b"",
    b"abcdef",  # one line, no newline at all
    b"\n\n\n",  # empty lines only
    b"a\nbb\n\nccc\nd",  # one-byte lines, an empty line, no trailing newline
    b"x\ny\n",
    "é✓\nü\n✓✓✓✓\n\nà".encode(),  # multi-byte characters: a cut target may fall inside one
]


@pytest.mark.parametrize("data", FILES, ids=range(len(FILES)))
def test_file_spans_are_the_documented_line_starts(tmp_path, data):
    path = tmp_path / "results.jsonl"
    path.write_bytes(data + b"tail beyond size\n")  # bytes after ``size`` are never looked at for a cut
    for size in range(len(data) + 1):
        for parts in range(1, len(data) + 4):  # parts beyond the lines (and the bytes) of the file too
            spans = file_spans(path, size, parts)
            assert spans == spans_by_definition(data + b"tail beyond size\n", size, parts), (size, parts)
            assert spans[0][0] == 0 and spans[-1][1] == size  # contiguous, covering [0, size)
            assert all(a < b for a, b in spans) or spans == [(0, 0)]
            assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))


def test_file_spans_hand_worked_example(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_bytes(b"aaaa\nbb\nc\ndddddd\n")  # line starts 0, 5, 8, 10; 17 bytes
    assert file_spans(path, 17, 1) == [(0, 17)]
    assert file_spans(path, 17, 2) == [(0, 8), (8, 17)]  # target 8 is a line start itself
    assert file_spans(path, 17, 3) == [(0, 5), (5, 17)]  # targets 5 and 11: no line start in [11, 17)
    assert file_spans(path, 17, 4) == [(0, 5), (5, 8), (8, 17)]  # targets 4, 8, 12
    assert file_spans(path, 9, 2) == [(0, 5), (5, 9)]  # the first 9 bytes: target 4
    assert file_spans(path, 3, 5) == [(0, 3)]  # size < parts: no line start inside
    assert file_spans(path, 0, 3) == [(0, 0)]


def _rows_file(tmp_path: Path) -> tuple[Path, list[dict], int, int]:
    """A results file of rows of varying lengths (non-ASCII included), 3 legacy rows among them, and a partial last
    line: ``(path, the current rows in order, legacy rows, bytes of the partial line)``."""
    current, data = [], b""
    for i in range(14):
        if i % 5 == 2:
            data += line(without(make_row(i, pred="é ✓" * i), "seed", "length"))  # legacy: left out, counted
            continue
        row = make_row(i, pred="é ✓" * (i % 4), note="x" * (7 * i % 11))
        current.append(row)
        data += line(row)
    partial = b'{"model": "m", "engine": "e", "pre'
    path = tmp_path / "results.jsonl"
    path.write_bytes(data + partial)
    return path, current, 3, len(partial)


def _read_spans(path: Path, spans: list[tuple[int, int]]) -> tuple[list[dict], FileStats]:
    """What the report's reader gets: every span read on its own, the rows joined in order, the stats summed."""
    rows, total = [], FileStats()
    for i, span in enumerate(spans):
        stats = FileStats()
        rows += [row for _, row in iter_file(path, stats, span, last=i == len(spans) - 1)]
        total.add(stats)
    return rows, total


def test_reading_every_span_gives_the_whole_files_rows_and_stats(tmp_path):
    path, current, legacy, partial = _rows_file(tmp_path)
    size = path.stat().st_size
    for parts in range(1, 24):
        rows, stats = _read_spans(path, file_spans(path, size, parts))
        assert rows == current, parts
        assert (stats.legacy, stats.cut_bytes) == (legacy, partial), parts
    # the first ``size`` bytes only, cut inside a row: that row is the incomplete last line
    data = path.read_bytes()
    ends = [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    size = ends[5] + 10  # 10 bytes into line 7 (item 6, current)
    for parts in range(1, 12):
        rows, stats = _read_spans(path, file_spans(path, size, parts))
        assert [r["item"] for r in rows] == [0, 1, 3, 4, 5], parts  # item 2 is legacy
        assert (stats.legacy, stats.cut_bytes) == (1, 10), parts


def test_file_stats_add_sums_both_counts():
    total = FileStats(legacy=2, cut_bytes=5)
    other = FileStats(legacy=3, cut_bytes=7)
    total.add(other)
    assert (total.legacy, total.cut_bytes) == (5, 12)
    assert (other.legacy, other.cut_bytes) == (3, 7)
    total.add(FileStats())
    assert (total.legacy, total.cut_bytes) == (5, 12)


@pytest.mark.parametrize("bad", [b"garbage\n", b"\n", b'{"model": "m"}\n'])
def test_a_corrupt_line_in_a_later_span_is_named_by_its_line_in_the_whole_file(tmp_path, bad):
    """Line 9 is bad: whichever span holds it, read on its own, says "line 9"; no other span complains. An empty
    line there too (then a span may start at that very newline)."""
    lines = [line(make_row(i, pred="é" * (i % 3))) for i in range(12)]
    lines[8] = bad
    path = tmp_path / "results.jsonl"
    path.write_bytes(b"".join(lines))
    size = path.stat().st_size
    expected = exact(
        f"{path}: line 9 is not a valid result row; fix or delete that line by hand (reading changes nothing)"
    )
    starts_at_bad = False
    for parts in range(1, 30):
        spans = file_spans(path, size, parts)
        errors = []
        for i, span in enumerate(spans):
            try:
                list(iter_file(path, FileStats(), span, last=i == len(spans) - 1))
            except ResultsError as e:
                errors.append(str(e))
        assert len(errors) == 1 and re.match(expected, errors[0]), (parts, errors)
        starts_at_bad |= any(start == sum(map(len, lines[:8])) for start, _ in spans)
    assert starts_at_bad  # some span began exactly at the bad line
    with pytest.raises(ResultsError, match=expected):
        read_results(tmp_path)


# --- which lines are rows, legacy rows, or neither ---------------------------------------------------------


def test_the_oldest_rows_lacking_every_newer_key_field_are_legacy(tmp_path):
    """A row with only the fields every row ever had (none of the five added later) is a legacy row."""
    oldest = without(make_row(0), *NEW.split(", "))
    (tmp_path / "results.jsonl").write_bytes(line(oldest) + line(make_row(1)))
    read = read_results(tmp_path)
    assert [r["item"] for r in read.rows] == [1]
    assert len(read.notes) == 1 and read.notes[0].startswith(f"left out 1 rows of {tmp_path / 'results.jsonl'} ")


@pytest.mark.parametrize(
    "broken",
    [without(make_row(0), "task", "seed"),  # lacks a field every row has (and a newer one): not a row at all
     make_row(0, p="half")],  # every field, but p is no number
)  # fmt: skip
def test_a_line_that_is_no_row_is_corruption_not_a_legacy_row(tmp_path, broken):
    path = tmp_path / "results.jsonl"
    path.write_bytes(line(make_row(1)) + line(broken) + line(make_row(2)))
    with pytest.raises(ResultsError, match=rf"^{re.escape(str(path))}: line 2 is not a valid result row; "):
        read_results(tmp_path)
    with pytest.raises(ResultsError, match=rf"^{re.escape(str(path))}: line 2 is not a valid result row; "):
        ResultsStore(tmp_path)


def _legacy_message(path: Path, n: int) -> str:
    return exact(
        f"{path} holds {n} rows of an older kvbench whose identity lacks some of {NEW}, so they could stand for the "
        "wrong settings (another prompt length, seed, context, weights or calibration artifact): run into a new --out "
        "directory, or `kvbench results upgrade DIR` to keep the rows that can be upgraded"
    )


def test_a_writer_refusing_legacy_rows_counts_a_last_one_without_its_newline(tmp_path):
    path = tmp_path / "results.jsonl"
    old = [without(make_row(i), "length") for i in range(3)]
    path.write_bytes(line(old[0]) + line(old[1]) + line(old[2]).rstrip(b"\n"))
    with pytest.raises(ResultsError, match=_legacy_message(path, 3)):
        ResultsStore(tmp_path)
    with pytest.raises(ResultsError, match=_legacy_message(path, 3)):  # from another shard's writer too
        ResultsStore(tmp_path, (1, 2))
    path.write_bytes(line(make_row(5)) + line(old[0]).rstrip(b"\n"))  # one legacy row, the unterminated last line
    with pytest.raises(ResultsError, match=_legacy_message(path, 1)):
        ResultsStore(tmp_path)


def _writer_corrupt_message(path: Path, number: int) -> str:
    """What a writer says of a bad line ``number`` of the results file ``path`` (anchored regex)."""
    return exact(
        f"{path}: line {number} is not a valid result row; the file was not modified. Fix or delete that line by "
        "hand, or use a different --out directory"
    )


def test_corruption_refused_by_a_writer_names_file_line_and_fix(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_bytes(line(make_row(0)) + b"garbage\n" + line(make_row(1)))
    message = _writer_corrupt_message(path, 2)
    with pytest.raises(ResultsError, match=message):
        ResultsStore(tmp_path)
    with pytest.raises(ResultsError, match=message):  # the upgrade refuses it with the same words
        upgrade_results(tmp_path, declares_no_artifact)


# --- the writer's repair of an interrupted last line --------------------------------------------------------


def test_a_complete_last_row_without_its_newline_is_a_stored_row(tmp_path):
    rows = [make_row(0), make_row(1, pred="é")]
    path = tmp_path / "results.jsonl"
    path.write_bytes(line(rows[0]) + line(rows[1]).rstrip(b"\n"))
    with ResultsStore(tmp_path) as store:
        assert store.rows() == rows
        assert store.is_done(make_row(1)) and store.is_done(row_key(make_row(1)))
        assert store.recorded_artifacts("m", "cd" * 32) == {"snapkv": {"None"}}
        with pytest.raises(ResultsError, match=r"^row \(.*\) is already in "):
            store.append(make_row(1, score=0.0))


def test_an_invalid_last_line_is_saved_whole_and_its_size_reported(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_bytes(line(make_row(0)) + b"garbage\n")
    with ResultsStore(tmp_path) as store:
        store.append(make_row(1))
        (saved,) = tmp_path.glob("results.jsonl.partial-*")
        assert saved.read_bytes() == b"garbage\n"
        assert store.recovered == (
            f"results.jsonl: dropped a partial last line (8 bytes, saved to {saved.name}) left by an interrupted run; "
            "1 finished rows kept"
        )
    assert path.read_bytes() == line(make_row(0)) + line(make_row(1))


# --- missing.json --------------------------------------------------------------------------------------------


def test_missing_json_is_utf8_one_task_a_line(tmp_path):
    """missing.json is meant to be read (and deleted) by hand: UTF-8 text as written, two-space indented."""
    with ResultsStore(tmp_path) as store:
        store.append(make_row(0))
        store.record_missing("ruler", "niah", "données absentes ✓")
        store.record_missing("b", "t", "x")
        assert store.missing() == {"ruler/niah": "données absentes ✓", "b/t": "x"}
    expected = '{\n  "ruler/niah": "données absentes ✓",\n  "b/t": "x"\n}\n'
    assert (tmp_path / "missing.json").read_bytes() == expected.encode("utf-8")


def test_a_corrupt_missing_json_is_refused_naming_the_fix(tmp_path):
    (tmp_path / "missing.json").write_text('{"b/t": ', encoding="utf-8")
    with ResultsStore(tmp_path) as store:
        with raises_exactly(f"{tmp_path / 'missing.json'} is corrupt; it was left as is. Delete it (the next run "
                                  "rewrites it)"):  # fmt: skip
            store.missing()


# --- the writer's lock -------------------------------------------------------------------------------------------


def test_holder_names_the_pid_and_command(tmp_path):
    path = tmp_path / "results.jsonl.lock"
    path.write_text('{"pid": 4242, "command": ["kvbench", "run", "--out", "a b"]}\n')
    assert ResultsLock.holder(path) == "pid 4242 (kvbench run --out a b)"


@pytest.mark.parametrize("content", [None, b"", b'{"pid": 7}', b"not json"])
def test_holder_gives_up_within_a_second_on_a_lock_without_its_pid(tmp_path, monkeypatch, content):
    path = tmp_path / "results.jsonl.lock"
    if content is not None:
        path.write_bytes(content)
    waits: list[float] = []
    monkeypatch.setattr(results_lock.time, "sleep", waits.append)
    assert ResultsLock.holder(path) == "a process that has not written its pid yet"
    assert waits and 0 < sum(waits) <= 1.0  # it waited a little for the pid, not so long that a refusal hangs


def test_discard_after_release_leaves_the_next_holders_file(tmp_path):
    path = tmp_path / "results.jsonl.lock"
    first = ResultsLock(path, wait=False)
    assert first.created
    first.release()
    second = ResultsLock(path, wait=False)  # another writer takes the lock (the file exists: not created)
    first.discard()  # the first lock holds nothing any more: it must not remove the second's file
    assert path.exists()
    with pytest.raises(BlockingIOError):
        ResultsLock(path, wait=False)  # the second still excludes everyone
    second.release()


def test_a_lock_file_removed_by_hand_does_not_break_closing(tmp_path):
    """A store that wrote nothing removes its lock file on close; one already removed (by hand) is no error."""
    out = tmp_path / "out"
    store = ResultsStore(out)
    (out / "results.jsonl.lock").unlink()
    store.close()
    assert not out.exists()


# --- kvbench results upgrade ---------------------------------------------------------------------------------


def test_upgrade_counts_every_row_and_reason(tmp_path):
    rows = [make_row(0), make_row(1, pred="é ✓"), make_row(2)]
    old = [without(make_row(3, method="gatesight"), "artifact_sha256"),
           without(make_row(4, method="gatesight"), "artifact_sha256"),
           without(make_row(5, pred="données ✓"), "artifact_sha256")]  # fmt: skip
    path = tmp_path / "results.jsonl"
    path.write_bytes(b"".join(map(line, [rows[0], old[0], rows[1], old[1], old[2], rows[2]])))
    (up,) = upgrade_results(tmp_path, declares_no_artifact)
    assert (up.current, up.upgraded) == (3, 1)
    reason = "method gatesight reads (or may read) a calibration artifact, which the row does not name"
    assert up.left_out == {reason: 2}
    new = path.read_bytes().splitlines(keepends=True)  # in file order, the removed rows gone
    assert [new[0], new[1], new[3]] == [line(r) for r in rows] and len(new) == 4  # current rows byte for byte
    assert "données ✓".encode() in new[2] and b"\\u" not in new[2]  # UTF-8 as the writer stores rows
    assert json.loads(new[2]) == old[2] | {"artifact_sha256": None}


def test_upgrade_reads_only_results_files(tmp_path):
    """A name the glob matches but that is no results file name, and a directory with a results name, are left
    alone."""
    old = without(make_row(1), "artifact_sha256")
    (tmp_path / "results.jsonl").write_bytes(line(old))
    (tmp_path / "results.old.jsonl").write_bytes(line(old))
    (tmp_path / "results.shard-0-of-2.jsonl").mkdir()
    ups = upgrade_results(tmp_path, declares_no_artifact)
    assert [(u.path.name, u.upgraded) for u in ups] == [("results.jsonl", 1)]
    assert (tmp_path / "results.old.jsonl").read_bytes() == line(old)


def test_upgrade_rewrites_a_later_file_after_an_unchanged_one(tmp_path):
    (tmp_path / "results.jsonl").write_bytes(line(make_row(0)))  # current: nothing to do, comes first by name
    shard = tmp_path / "results.shard-1-of-2.jsonl"
    old = without(make_row(1), "artifact_sha256")
    shard.write_bytes(line(old))
    first, second = upgrade_results(tmp_path, declares_no_artifact)
    assert not first.changed and first.backup is None
    assert second.upgraded == 1 and second.backup is not None and second.backup.read_bytes() == line(old)
    assert [json.loads(x) for x in shard.read_bytes().splitlines()] == [old | {"artifact_sha256": None}]


def test_upgrade_that_cannot_save_the_original_changes_nothing(tmp_path, monkeypatch):
    """The backup is created exclusively: when its name is taken (here: the same nanosecond twice), the upgrade
    stops with the backup's name and the file is left as it was."""
    path = tmp_path / "results.jsonl"
    data = line(without(make_row(1), "artifact_sha256"))
    path.write_bytes(data)
    taken = tmp_path / "results.jsonl.pre-upgrade-7"
    taken.write_bytes(b"an earlier backup")
    monkeypatch.setattr(results_upgrade.time, "time_ns", lambda: 7)
    message = exact(
        f"cannot write {taken}: File exists; 0 finished rows are saved there. Fix that (free space, permissions) "
        "and rerun the same command: it resumes where it stopped"
    )
    with pytest.raises(ResultsError, match=message):
        upgrade_results(tmp_path, declares_no_artifact)
    monkeypatch.undo()
    assert path.read_bytes() == data and taken.read_bytes() == b"an earlier backup"


# --- the row schema's declarations -------------------------------------------------------------------------------


def test_field_declares_its_absent_rule_and_default():
    plain = _field()
    assert plain.metadata == {"absent": Absent.NEVER, "omit_empty": False}
    assert plain.default is MISSING and plain.default_factory is MISSING
    legacy = _field(Absent.LEGACY)
    assert legacy.metadata == {"absent": Absent.LEGACY, "omit_empty": False}
    assert legacy.default is MISSING and legacy.default_factory is MISSING
    flag = _field(Absent.DEFAULT, False)
    assert flag.metadata == {"absent": Absent.DEFAULT, "omit_empty": False}
    assert flag.default is False and flag.default_factory is MISSING
    one = _field(Absent.DEFAULT, 1)
    assert one.default == 1 and one.default_factory is MISSING
    options = _field(Absent.DEFAULT, {}, omit_empty=True)
    assert options.metadata == {"absent": Absent.DEFAULT, "omit_empty": True}
    assert options.default is MISSING
    made = options.default_factory(), options.default_factory()
    assert made == ({}, {}) and type(made[0]) is dict and made[0] is not made[1]  # a fresh dict each time
    listed = _field(Absent.DEFAULT, [])
    assert listed.default_factory() == [] and type(listed.default_factory()) is list


def test_from_dict_names_every_field_a_line_lacks():
    key = {"model": "m", "engine": "e", "method": "snapkv", "allocation": "uniform", "p": 0.5, "bench": "b",
           "task": "t", "item": "0", "question": "q", "context_sha256": "ab", "model_fingerprint": "cd",
           "artifact_sha256": None}  # fmt: skip
    with pytest.raises(ValueError, match=r"^the row lacks length, seed$"):
        RowKey.from_dict(key)


# --- the writer's files: modes, messages, formats, the meta lock --------------------------------------------------


def _write_message(path: Path, reason: str, saved: int) -> str:
    return exact(
        f"cannot write {path}: {reason}; {saved} finished rows are saved there. Fix that (free space, permissions) "
        "and rerun the same command: it resumes where it stopped"
    )


def test_atomic_write_failure_names_the_file_and_reason(tmp_path):
    target = tmp_path / "manifest.json"
    target.mkdir()
    (target / "inside").write_text("x")  # a non-empty directory cannot be replaced by a file
    with pytest.raises(ResultsError, match=_write_message(target, "Is a directory", 0)):
        atomic_write(target, "{}\n")
    assert [p.name for p in target.iterdir()] == ["inside"]


def test_a_results_file_and_its_lock_are_created_rw_r__r__(tmp_path):
    old = os.umask(0)
    try:
        with ResultsStore(tmp_path) as store:
            store.append(make_row(0))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "results.jsonl").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "results.jsonl.lock").stat().st_mode) == 0o644  # its lock file too


def test_a_results_file_that_cannot_be_created_at_the_first_append(tmp_path):
    with ResultsStore(tmp_path) as store:
        (tmp_path / "results.jsonl").mkdir()  # appeared after the store opened (no file then)
        with pytest.raises(ResultsError, match=_write_message(tmp_path / "results.jsonl", "Is a directory", 0)):
            store.append(make_row(0))


def test_a_repair_that_cannot_save_the_partial_line_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    data = line(make_row(0)) + line(make_row(1)) + b'{"model": "m", "eng'
    path.write_bytes(data)
    monkeypatch.setattr(results_scan.time, "time_ns", lambda: 5)
    (tmp_path / f"results.jsonl.partial-{os.getpid()}-5").mkdir()  # the partial line's name is taken
    with ResultsStore(tmp_path) as store:
        with pytest.raises(ResultsError, match=_write_message(path, "Is a directory", 2)):
            store.append(make_row(2))
        assert path.read_bytes() == data
        # a caller that catches the error and appends again once the name is free gets the repair first, not its
        # row glued to the partial bytes (which readers would skip as an incomplete line)
        (tmp_path / f"results.jsonl.partial-{os.getpid()}-5").rmdir()
        store.append(make_row(2))
    assert path.read_bytes() == line(make_row(0)) + line(make_row(1)) + line(make_row(2))
    assert (tmp_path / f"results.jsonl.partial-{os.getpid()}-5").read_bytes() == b'{"model": "m", "eng'
    assert [r["item"] for r in read_results(tmp_path).rows] == [0, 1, 2]


def test_rows_are_stored_as_utf8_text(tmp_path):
    with ResultsStore(tmp_path) as store:
        store.append(make_row(0, pred="é ✓ 中"))
    data = (tmp_path / "results.jsonl").read_bytes()
    assert "é ✓ 中".encode() in data and b"\\u" not in data


def test_a_closed_store_refuses_every_write(tmp_path):
    store = ResultsStore(tmp_path)
    store.close()
    closed = exact(f"the results store {tmp_path / 'results.jsonl'} is closed")
    with pytest.raises(ResultsError, match=closed):
        store.append(make_row(0))
    with pytest.raises(ResultsError, match=closed):
        store.write_manifest({"model": "m", "model_fingerprint": "f"})
    with pytest.raises(ResultsError, match=closed):
        store.record_missing("b", "t", "absent")


def test_an_update_deferred_after_the_first_row_is_made_at_once(tmp_path):
    calls = []
    with ResultsStore(tmp_path) as store:
        store.defer(lambda: calls.append("before"))
        assert calls == []
        store.append(make_row(0))
        assert calls == ["before"]
        store.defer(lambda: calls.append("after"))
        assert calls == ["before", "after"]
        store.append(make_row(1))
        assert calls == ["before", "after"]


def test_a_store_that_wrote_keeps_its_lock_file(tmp_path):
    """Only a store that wrote nothing removes its lock file on close; one that wrote rows, or only the manifest,
    keeps what it opened (a lock file is no sign of a live writer)."""
    with ResultsStore(tmp_path / "rows") as store:
        store.append(make_row(0))
    assert sorted(p.name for p in (tmp_path / "rows").iterdir()) == ["results.jsonl", "results.jsonl.lock"]
    with ResultsStore(tmp_path / "manifest") as store:
        store.write_manifest({"model": "m", "model_fingerprint": "f"})
    assert sorted(p.name for p in (tmp_path / "manifest").iterdir()) == [
        "manifest.json", "meta.lock", "results.jsonl.lock"
    ]  # fmt: skip


def test_manifest_and_missing_updates_wait_for_the_directorys_meta_lock(tmp_path):
    with ResultsStore(tmp_path) as store:
        held = ResultsLock(tmp_path / "meta.lock", wait=False)  # another shard's writer is updating them
        errors = []

        def update():
            try:
                store.write_manifest({"model": "m", "model_fingerprint": "f"})
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        worker = threading.Thread(target=update)
        worker.start()
        worker.join(0.5)
        assert worker.is_alive() and not (tmp_path / "manifest.json").exists()  # waiting, not refused
        held.release()
        worker.join(30)
        assert not worker.is_alive() and errors == []
        assert store.manifest() == {"runs": [{"model": "m", "model_fingerprint": "f"}]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "meta.lock", "results.jsonl.lock"]


def test_manifest_is_utf8_two_space_indented(tmp_path):
    with ResultsStore(tmp_path) as store:
        store.write_manifest({"model": "modèle ✓", "model_fingerprint": "f"})
    expected = '{\n  "runs": [\n    {\n      "model": "modèle ✓",\n      "model_fingerprint": "f"\n    }\n  ]\n}\n'
    assert (tmp_path / "manifest.json").read_bytes() == expected.encode("utf-8")


@pytest.mark.parametrize("text", ['{"runs": [', '{"runs": 3}', "[]"])
def test_a_corrupt_manifest_is_refused_naming_the_fix(tmp_path, text):
    (tmp_path / "manifest.json").write_text(text, encoding="utf-8")
    with ResultsStore(tmp_path) as store:
        message = exact(
            f"{tmp_path / 'manifest.json'} is corrupt; it was left as is. Repair or move it away, or use a different "
            "--out directory"
        )
        with pytest.raises(ResultsError, match=message):
            store.manifest()


def test_a_model_name_clash_names_both_fingerprints(tmp_path):
    with ResultsStore(tmp_path) as store:
        store.write_manifest({"model": "qwen", "model_fingerprint": "abc"})
        message = exact(
            f"{tmp_path} already holds results of a different model named 'qwen' (fingerprint abc != def); rows of "
            "two different models with the same name would be mixed. Use a different --out directory"
        )
        with pytest.raises(ResultsError, match=message):
            store.check_model("qwen", "def")


def test_reading_a_file_that_is_a_directory_or_gone(tmp_path):
    with raises_exactly(f"{tmp_path} is a directory, not a results file: move it away or use a different --out"):
        read_file_bytes(tmp_path)
    gone = tmp_path / "results.jsonl"
    with raises_exactly(f"cannot read {gone} (No such file or directory); fix its permissions or use another --out"):
        read_file_bytes(gone)


def test_a_writer_reads_only_the_other_results_files(tmp_path):
    """Another name the glob matches (results.old.jsonl, here holding a legacy row) and a directory with a shard's
    name are no results files: the writer ignores them."""
    (tmp_path / "results.old.jsonl").write_bytes(line(without(make_row(7), "seed")) + b"garbage\n" + line(make_row(8)))
    (tmp_path / "results.shard-1-of-2.jsonl").mkdir()
    with ResultsStore(tmp_path) as store:
        assert not store.is_done(make_row(8))
        store.append(make_row(8))
    (tmp_path / "results.shard-1-of-2.jsonl").rmdir()  # (a reader refuses it: test_results_file_that_is_a_directory)
    assert [r["item"] for r in read_results(tmp_path).rows] == [8]  # the reader ignores results.old.jsonl too


def test_corruption_in_another_results_file_names_that_file(tmp_path):
    shard = tmp_path / "results.shard-1-of-2.jsonl"
    shard.write_bytes(line(make_row(0)) + b"{}\n" + line(make_row(1)))
    with pytest.raises(ResultsError, match=_writer_corrupt_message(shard, 2)):
        ResultsStore(tmp_path)


def test_a_row_that_is_no_json_is_refused_naming_the_fix(tmp_path):
    with ResultsStore(tmp_path) as store:
        with pytest.raises(
            ResultsError,
            match=r"^row \(.+\) cannot be stored as JSON \(.+\); results must be finite "
            r"numbers, strings, lists or dicts — fix the value that produced it$",
        ):
            store.append(make_row(0, score=float("nan")))
        with pytest.raises(ResultsError, match=r"^row \(.+\) cannot be stored as JSON \(.+\); results must be "):
            store.append(make_row(0, extra={1, 2}))  # a set: not JSON


def test_a_failed_append_says_how_many_rows_are_saved(tmp_path, monkeypatch):
    import errno

    with ResultsStore(tmp_path) as store:
        store.append(make_row(0))
        store.append(make_row(1))

        def full_disk(fd, buf):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(results_store.os, "write", full_disk)
        with pytest.raises(ResultsError, match=_write_message(tmp_path / "results.jsonl", "the disk is full", 2)):
            store.append(make_row(2))


def test_is_done_refuses_a_key_of_another_length(tmp_path):
    """A key tuple must have every ROW_KEY field: one of an older length would otherwise be read with a default."""
    with ResultsStore(tmp_path) as store:
        store.append(make_row(0))
        key = row_key(make_row(0))
        assert store.is_done(key)
        with pytest.raises(ValueError):
            store.is_done(key[:-1])
        with pytest.raises(ValueError):
            store.is_done((*key, "extra"))


def test_an_existing_results_file_that_cannot_be_written_is_refused_at_open(tmp_path, monkeypatch):
    """Refused before the run computes anything (not at its first row); root ignores chmod, so the open itself is
    refused here."""
    import errno

    path = tmp_path / "results.jsonl"
    path.write_bytes(line(make_row(0)))
    real = os.open

    def refuse(name, flags, *args):
        if Path(name) == path and flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(errno.EACCES, "Permission denied", str(name))
        return real(name, flags, *args)

    monkeypatch.setattr(results_store.os, "open", refuse)
    with pytest.raises(ResultsError, match=_write_message(path, "Permission denied", 1)):
        ResultsStore(tmp_path)


def test_a_store_that_wrote_nothing_leaves_the_directories_as_they_were(tmp_path):
    """It removes its lock file and the directories it created, never one that was there before."""
    (tmp_path / "empty").mkdir()
    ResultsStore(tmp_path / "empty").close()
    assert (tmp_path / "empty").is_dir() and list((tmp_path / "empty").iterdir()) == []
    ResultsStore(tmp_path / "empty" / "a" / "b").close()
    assert list((tmp_path / "empty").iterdir()) == []
    with ResultsStore(tmp_path / "kept" / "c") as store:
        store.append(make_row(0))
    assert sorted(p.name for p in (tmp_path / "kept" / "c").iterdir()) == ["results.jsonl", "results.jsonl.lock"]


def test_a_directory_that_cannot_be_created_is_refused_without_leftovers(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "sub"
    message = exact(
        f"cannot create or write the results directory {out} (Not a directory); pick another one with --out"
    )
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(ResultsError, match=message) as info:
        ResultsStore(out)
    del info
    gc.collect()  # the half-built store is dropped: closing it must not fail either
    assert unraisable == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_second_writer_is_told_who_writes_and_what_to_do(tmp_path):
    path = tmp_path / "results.jsonl"
    with ResultsStore(tmp_path):
        holder = re.escape(f"{path} is being written by another kvbench run, pid {os.getpid()} (")
        fix = re.escape(
            "): wait for it to finish, or use another --out (shards of one run: --shard i/N, each its own file)"
        )
        message = f"^{holder}.*{fix}$"
        with pytest.raises(ResultsError, match=message):
            ResultsStore(tmp_path)


def test_a_lock_file_left_by_an_earlier_run_stays(tmp_path):
    """A store that wrote nothing removes only a lock file it created: the one an earlier writer left stays."""
    with ResultsStore(tmp_path) as store:
        store.append(make_row(0))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert "results.jsonl.lock" in before
    ResultsStore(tmp_path).close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before)


def test_a_lock_file_removed_between_the_two_opens_is_created(tmp_path, monkeypatch):
    """The file existed at the exclusive create, then its holder removed it before it was opened: create it."""
    path = tmp_path / "results.jsonl.lock"
    real, calls = os.open, []

    def racing_open(name, flags, *args):
        calls.append(flags)
        if len(calls) == 1:
            raise FileExistsError(17, "File exists", str(name))
        if len(calls) == 2:
            raise FileNotFoundError(2, "No such file or directory", str(name))
        return real(name, flags, *args)

    monkeypatch.setattr(results_lock.os, "open", racing_open)
    lock = ResultsLock(path, wait=False)
    monkeypatch.undo()
    assert len(calls) == 3 and calls[2] & os.O_EXCL and lock.created and path.exists()
    with pytest.raises(BlockingIOError):
        ResultsLock(path, wait=False)
    lock.release()


def test_a_lock_file_removed_while_waiting_for_it_is_opened_again(tmp_path, monkeypatch):
    """The holder removed the file just as this lock got it: the lock is taken again on the file the path names, so
    no two holders lock two files of one name (and the first descriptor is closed)."""
    path = tmp_path / "results.jsonl.lock"
    path.write_text("")
    real, calls = results_lock.fcntl.flock, []

    def flock_then_removed(fd, op):
        real(fd, op)
        calls.append(fd)
        if len(calls) == 1:
            path.unlink()  # the previous holder discarded the file as it released it

    monkeypatch.setattr(results_lock.fcntl, "flock", flock_then_removed)
    before = len(os.listdir("/proc/self/fd"))
    lock = ResultsLock(path, wait=True)
    assert len(os.listdir("/proc/self/fd")) == before + 1  # the first descriptor was closed
    monkeypatch.undo()
    assert len(calls) == 2 and path.exists() and lock.created
    with pytest.raises(BlockingIOError):
        ResultsLock(path, wait=False)
    lock.release()


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_lock_that_cannot_be_taken_is_refused_and_its_file_closed(tmp_path, monkeypatch):
    import errno

    path = tmp_path / "results.jsonl.lock"

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(results_lock.fcntl, "flock", no_locks)
    before = _open_fds()
    with raises_exactly(f"cannot lock {path} (No locks available); use another --out"):
        ResultsLock(path, wait=False)
    assert _open_fds() == before


def test_a_lock_file_that_cannot_be_opened_is_refused_naming_the_fix(tmp_path):
    (tmp_path / "results.jsonl.lock").mkdir()
    message = exact(
        f"cannot open the lock file {tmp_path / 'results.jsonl.lock'} (Is a directory): remove it or make it a "
        "writable file (when no kvbench run is writing there), or use another --out"
    )
    with pytest.raises(ResultsError, match=message):
        ResultsStore(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl.lock"]


def test_check_results_file_that_cannot_be_looked_at(tmp_path):
    (tmp_path / "afile").write_text("x")
    path = tmp_path / "afile" / "results.jsonl"
    message = exact(f"cannot read {path} (Not a directory); fix its permissions or use another --out")
    with pytest.raises(ResultsError, match=message):
        check_results_file(path)


def test_check_results_file_refuses_a_second_name_or_a_special_file(tmp_path):
    path = tmp_path / "results.jsonl"
    (tmp_path / "elsewhere.jsonl").write_bytes(line(make_row(0)))
    path.symlink_to("elsewhere.jsonl")
    with raises_exactly(
        f"{path} is a symbolic link (to elsewhere.jsonl): its writer's lock covers one name only, so runs through "
        "another name would write it at once; replace the link by a copy of the file, or use another --out"
    ):
        check_results_file(path)
    path.unlink()
    os.link(tmp_path / "elsewhere.jsonl", path)  # exactly two names
    with raises_exactly(
        f"{path} has 2 hard links: its writer's lock covers one name only, so runs through another name would "
        "write it at once; replace it by a copy of its own (cp, then mv over it), or use another --out"
    ):
        check_results_file(path)
    path.unlink()
    check_results_file(path)  # absent: fine
    os.mkfifo(path)
    with raises_exactly(f"{path} is not a regular file: move it away or use another --out"):
        check_results_file(path)


def test_a_store_whose_construction_failed_at_once_is_dropped_quietly(monkeypatch):
    """__del__ closes a store dropped without close(), even one whose __init__ failed before setting anything up."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(TypeError):
        ResultsStore(None)  # type: ignore[arg-type]
    gc.collect()
    assert unraisable == []


def test_a_reader_merges_files_counting_each_duplicate_and_keeping_every_note(tmp_path):
    first, second = tmp_path / "results.shard-0-of-2.jsonl", tmp_path / "results.shard-1-of-2.jsonl"
    partial = b'{"model": "m", "eng'
    first.write_bytes(line(make_row(0)) + line(without(make_row(9), "seed")) + line(make_row(1)) + partial)
    second.write_bytes(line(make_row(1, score=1.0)) + line(make_row(0, score=2.0)) + line(make_row(2))
                       + line(make_row(0, score=3.0)) + line(make_row(3)))  # fmt: skip
    read = read_results(tmp_path)
    assert [(r["item"], r["score"]) for r in read.rows] == [(0, 100.0), (1, 100.0), (2, 100.0), (3, 100.0)]
    assert len(read.notes) == 3
    assert read.notes[0] == (
        f"skipped an incomplete last line in {first} ({len(partial)} bytes: a run is writing it or was interrupted; "
        "rerunning it redoes that row)"
    )
    assert read.notes[1] == (
        f"left out 1 rows of {first} written by an older kvbench: their identity lacks some of {NEW}; "
        f"`kvbench results upgrade {tmp_path}` keeps those that can be upgraded, rerun into a new --out for the rest"
    )
    assert read.notes[2] == "3 rows stored more than once (overlapping shards?) were counted once"


def test_a_reader_names_what_to_give_it(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_bytes(line(make_row(0)))
    with raises_exactly(f"{path} is a file: give the directory that holds it (its run's --out), e.g. {tmp_path}"):
        read_results(path)
    absent = tmp_path / "nope"
    with raises_exactly(f"no results directory {absent}: run `kvbench run --out {absent}` first"):
        read_results([tmp_path, absent])


def test_a_reader_merges_missing_json_and_refuses_a_corrupt_one(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.jsonl").write_bytes(line(make_row(0)))
    (tmp_path / "a" / "missing.json").write_text('{"b/t": "absent"}')
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "missing.json").write_text('{"b/u": "no data"}')  # missing data only: still a directory to read
    read = read_results([tmp_path / "a", tmp_path / "b"])
    assert read.missing == {"b/t": "absent", "b/u": "no data"} and [r["item"] for r in read.rows] == [0]
    (tmp_path / "b" / "missing.json").write_text('["b/u"]')
    with raises_exactly(
        f"{tmp_path / 'b' / 'missing.json'} is corrupt; it was left as is. Delete it (the next run rewrites it)"
    ):
        read_results([tmp_path / "a", tmp_path / "b"])


@pytest.mark.parametrize("tail", [b"{", b"\n"])
def test_a_one_byte_last_line_is_an_incomplete_last_line(tmp_path, tail):
    """A writer has written the first byte of its row (or a stray newline ends the file): skipped and noted."""
    path = tmp_path / "results.jsonl"
    path.write_bytes(line(make_row(0)) + tail)
    read = read_results(tmp_path)
    assert [r["item"] for r in read.rows] == [0]
    assert read.notes == [f"skipped an incomplete last line in {path} (1 bytes: a run is writing it or was "
                          "interrupted; rerunning it redoes that row)"]  # fmt: skip


def test_iter_file_decodes_with_the_given_decoder(tmp_path):
    """A reader that needs only some fields decodes only those (the report does): the rows are what it decoded."""
    path = tmp_path / "results.jsonl"
    path.write_bytes(line(make_row(0, pred="é")) + line(make_row(1)))
    wanted = (*ROW_KEY, "score")

    def some_fields(raw: bytes) -> dict:
        row = json.loads(raw)
        return {k: row[k] for k in wanted if k in row}

    rows = [row for _, row in iter_file(path, FileStats(), decode=some_fields)]
    assert rows == [{k: make_row(i)[k] for k in wanted if k in make_row(i)} for i in range(2)]
    assert "pred" not in rows[0]


def test_iter_file_counts_into_the_stats_it_is_given(tmp_path):
    """Two files read into one FileStats: both files' legacy rows and incomplete last lines are counted."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(line(without(make_row(0), "seed")) + line(make_row(1)) + b'{"mo')
    b.write_bytes(line(without(make_row(2), "length")) + line(make_row(3)) + b'{"model": "m"')
    stats = FileStats()
    assert [r["item"] for _, r in iter_file(a, stats)] == [1]
    assert [r["item"] for _, r in iter_file(b, stats)] == [3]
    assert (stats.legacy, stats.cut_bytes) == (2, 4 + 13)


def test_iter_file_of_a_file_that_is_gone(tmp_path):
    gone = tmp_path / "results.jsonl"
    with raises_exactly(f"cannot read {gone} (No such file or directory); fix its permissions or use another --out"):
        list(iter_file(gone, FileStats()))


def test_read_json_refuses_what_is_not_json_whatever_is_expected(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('"a string"')
    assert read_json(path, str, "Fix it.") == "a string"
    assert read_json(tmp_path / "absent.json", str, "Fix it.") is None
    path.write_text('"unterminated')
    with raises_exactly(f"{path} is corrupt; it was left as is. Fix it."):
        read_json(path, str, "Fix it.")


def test_row_key_names_what_is_wrong_with_a_row():
    needed = [
        "model",
        "engine",
        "method",
        "allocation",
        "p",
        "bench",
        "task",
        "item",
        "question",
        "length",
        "seed",
        "context_sha256",
        "model_fingerprint",
        "artifact_sha256",
    ]  # every key field but source (it defaults)
    with raises_exactly(f"row is missing key field(s) ['task', 'seed']; every row needs all of {needed}"):
        row_key(without(make_row(0), "task", "seed"))
    with raises_exactly("row field p='half' is not a number (the kept fraction, e.g. 0.5)"):
        row_key(make_row(0, p="half"))
