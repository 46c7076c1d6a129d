"""kvbench.task_cache: the one cache class of generated task data (RULER and SCBench use it)."""

from __future__ import annotations

import json

import pytest

from kvbench.task_cache import TaskDataCache

KEY = {"version": 3, "task": "kv", "length": 512, "seed": 0}


def _cache(directory, key=KEY):
    return TaskDataCache(directory, key, f"{key['task']}-{key['length']}", ".jsonl", "Demo")


def _rows(text):
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def test_miss_then_hit(tmp_path):
    cache = _cache(tmp_path / "c")
    assert cache.load(_rows) is None  # no file yet, no folder either
    cache.store('{"a": 1}\n{"a": 2}\n')
    assert cache.load(_rows) == [{"a": 1}, {"a": 2}]
    assert cache.path.parent == tmp_path / "c" and cache.path.read_text() == '{"a": 1}\n{"a": 2}\n'
    assert [p.name for p in cache.path.parent.iterdir()] == [cache.path.name]  # no temp file left


def test_name_is_stem_and_digest_of_the_key(tmp_path):
    path = _cache(tmp_path).path
    assert path.name.startswith("kv-512-") and path.suffix == ".jsonl"
    assert len(path.name) == len("kv-512-") + 24 + len(".jsonl")
    assert _cache(tmp_path, dict(KEY)).path == path  # same key, same file (key order does not matter)
    assert _cache(tmp_path, {**KEY, "seed": 1}).path != path  # any change to the key is another file


@pytest.mark.parametrize(
    "content",
    [b'{"a": 1}\n{"a": 2', b"\xff\xfe not utf-8", b'{"a": 1}\nnot json\n'],
    ids=["truncated", "not-utf8", "garbage"],
)
def test_corrupt_file_loads_as_none_so_the_bench_regenerates(tmp_path, content):
    cache = _cache(tmp_path)
    cache.path.write_bytes(content)
    assert cache.load(_rows) is None


def test_decoder_errors_read_as_corrupt(tmp_path):
    cache = _cache(tmp_path)
    cache.store('{"contexts": 1}')
    assert cache.load(lambda text: json.loads(text)["key"]) is None  # KeyError
    assert cache.load(lambda text: json.loads(text)["contexts"][0]) is None  # TypeError
    assert cache.load(lambda text: json.loads(text)["contexts"].get("x")) is None  # AttributeError


def test_unwritable_directory_warns_and_keeps_going(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache folder should be")
    cache = _cache(blocker / "sub")
    with pytest.warns(UserWarning, match="could not write the Demo cache"):
        cache.store("x\n")
    assert cache.load(_rows) is None
