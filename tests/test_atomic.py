"""kvbench.atomic: a write either fully replaces the file or leaves the old one, with no temp file left."""

from __future__ import annotations

import json

import pytest

from kvbench import atomic


def test_write_atomic_text_bytes_and_parent(tmp_path):
    path = tmp_path / "sub" / "f.txt"
    atomic.write_atomic(path, "héllo")
    assert path.read_text(encoding="utf-8") == "héllo"
    atomic.write_atomic(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    assert [p.name for p in path.parent.iterdir()] == ["f.txt"]


def test_write_json_round_trips(tmp_path):
    path = tmp_path / "d.json"
    atomic.write_json(path, {"b": 1, "a": [2]}, sort_keys=True)
    assert path.read_text(encoding="utf-8") == '{"a": [2], "b": 1}'
    assert json.loads(path.read_text()) == {"a": [2], "b": 1}


def test_failure_mid_write_keeps_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    path.write_text("old")

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        atomic.write_atomic(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_write_with_callback_and_failure(tmp_path):
    path = tmp_path / "w.bin"
    atomic.write_with(path, lambda tmp: tmp.write_bytes(b"new"))
    assert path.read_bytes() == b"new"

    def half_then_fail(tmp):
        tmp.write_bytes(b"half")
        raise RuntimeError("writer died")

    with pytest.raises(RuntimeError, match="writer died"):
        atomic.write_with(path, half_then_fail)
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["w.bin"]


def test_write_with_mode(tmp_path):
    path = tmp_path / "lib.so"
    atomic.write_with(path, lambda tmp: tmp.write_bytes(b"elf"), mode=0o755)
    assert path.stat().st_mode & 0o777 == 0o755
    atomic.write_with(path, lambda tmp: tmp.write_bytes(b"elf"))
    assert path.stat().st_mode & 0o777 == 0o644


def _fill(text):
    def write(tmp):
        (tmp / "a.txt").write_text(text)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text(text * 2)

    return write


def test_write_dir_creates_and_replaces_whole(tmp_path):
    path = tmp_path / "parent" / "model"
    assert atomic.write_dir(path, _fill("one")) is True
    assert (path / "a.txt").read_text() == "one" and (path / "sub" / "b.txt").read_text() == "oneone"
    (path / "stale.txt").write_text("from the old folder")
    assert atomic.write_dir(path, _fill("two")) is True
    assert sorted(p.name for p in path.iterdir()) == ["a.txt", "sub"]
    assert (path / "a.txt").read_text() == "two"
    assert path.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in path.parent.iterdir()] == ["model"]


def test_write_dir_without_overwrite_keeps_the_first(tmp_path):
    path = tmp_path / "model"
    atomic.write_dir(path, _fill("first"))
    assert atomic.write_dir(path, _fill("second"), overwrite=False) is False
    assert (path / "a.txt").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_write_dir_without_overwrite_loses_a_race_quietly(tmp_path):
    path = tmp_path / "model"

    def racing(tmp):  # another process finishes the same build while this one writes
        _fill("theirs")(tmp)
        atomic.write_dir(path, _fill("winner"))

    assert atomic.write_dir(path, racing, overwrite=False) is False
    assert (path / "a.txt").read_text() == "winner"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_write_dir_failure_keeps_old_folder_and_no_temp(tmp_path):
    path = tmp_path / "ckpt"
    atomic.write_dir(path, _fill("old"))

    def half_then_fail(tmp):
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("writer died")

    with pytest.raises(RuntimeError, match="writer died"):
        atomic.write_dir(path, half_then_fail)
    assert (path / "a.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_write_dir_failed_swap_restores_the_old_folder(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    atomic.write_dir(path, _fill("old"))
    real = atomic.os.replace

    def refuse_new(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError("rename refused")
        real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", refuse_new)
    with pytest.raises(OSError, match="rename refused"):
        atomic.write_dir(path, _fill("new"))
    assert (path / "a.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_move_into_place_publishes_a_finished_part(tmp_path):
    part, dest = tmp_path / "f.bin.part", tmp_path / "f.bin"
    part.write_bytes(b"whole")
    dest.write_bytes(b"old")
    atomic.move_into_place(part, dest)
    assert dest.read_bytes() == b"whole" and not part.exists()
