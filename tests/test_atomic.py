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
