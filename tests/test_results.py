"""ResultsStore: round trip, resume keys, crash recovery, refusal of corruption, manifest."""

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.results.keys import ROW_KEY, ResultsError, row_key
from kvbench.results.read import read_results
from kvbench.results.store import ResultsStore


def make_row(i: int = 0, p: float = 0.5, **extra) -> dict:
    """A complete row whose key varies with ``i`` and ``p``."""
    return {
        "model": "m",
        "engine": "e",
        "method": "snapkv",
        "allocation": "uniform",
        "p": p,
        "bench": "b",
        "task": "t",
        "item": i,
        "question": "q0",
        "length": 1024,
        "seed": 42,
        "context_sha256": "ab" * 32,
        "model_fingerprint": "cd" * 32,
        "artifact_sha256": None,
        "score": 100.0,
        **extra,
    }


def test_append_reload_round_trip(tmp_path):
    rows = [make_row(i, pred="é ✓") for i in range(3)]
    with ResultsStore(tmp_path / "out" / "run") as store:
        for r in rows:
            store.append(r)
        assert store.rows() == rows
    reloaded = ResultsStore(tmp_path / "out" / "run")
    assert reloaded.rows() == rows
    assert len(reloaded) == 3
    assert reloaded.recovered is None


def test_is_done_by_row_and_by_key(tmp_path):
    with ResultsStore(tmp_path) as store:
        store.append(make_row(1))
        assert store.is_done(make_row(1))
        assert store.is_done(row_key(make_row(1)))
        assert not store.is_done(make_row(2))
        assert not store.is_done(make_row(1, p=0.25))


@pytest.mark.parametrize(
    "field, other",
    [("length", 512), ("seed", 7), ("context_sha256", "ef" * 32), ("model_fingerprint", "01" * 32), ("engine", "v"),
     ("artifact_sha256", "12" * 32)],
)  # fmt: skip
def test_every_setting_that_changes_an_answer_is_in_the_identity(tmp_path, field, other):
    """issue 17 item 1: a row of another length, seed, context, model (dtype included), engine or calibration
    artifact is not done."""
    assert field in ROW_KEY
    with ResultsStore(tmp_path) as store:
        store.append(make_row(0))
        assert not store.is_done(make_row(0, **{field: other}))
        store.append(make_row(0, **{field: other}))  # both settings live in one directory
    assert len(read_results(tmp_path).rows) == 2


def test_p_is_normalised(tmp_path):
    with ResultsStore(tmp_path) as store:
        store.append(make_row(p=0.1))
        key = list(row_key(make_row(p=0.1)))
        key[ROW_KEY.index("p")] = 0.1000000001
        assert store.is_done(tuple(key))
        assert store.is_done(make_row(p="0.10000001"))
        store.append(make_row(p=0.12345678, item=9))
    assert ResultsStore(tmp_path).rows()[1]["p"] == 0.1235


def test_duplicate_append_raises(tmp_path):
    with ResultsStore(tmp_path) as store:
        store.append(make_row(p=0.1))
        with pytest.raises(ResultsError, match="already"):
            store.append(make_row(p=0.1000000001, score=0.0))
    assert len(ResultsStore(tmp_path)) == 1


def test_missing_key_field_raises(tmp_path):
    row = make_row()
    del row["task"]
    with pytest.raises(ResultsError, match="task"):
        with ResultsStore(tmp_path) as store:
            store.append(row)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_raises_and_file_unchanged(tmp_path, bad):
    with ResultsStore(tmp_path) as store:
        store.append(make_row(0))
        before = store.path.read_bytes()
        with pytest.raises(ResultsError, match="finite"):
            store.append(make_row(1, score=bad))
        assert store.path.read_bytes() == before
        assert not store.is_done(make_row(1))


def test_crash_partial_last_line_is_dropped_and_saved(tmp_path):
    with ResultsStore(tmp_path) as store:
        for i in range(3):
            store.append(make_row(i))
    complete = store.path.read_bytes()
    partial = b'{"model": "m", "engi'
    store.path.write_bytes(complete + partial)

    with ResultsStore(tmp_path) as store:
        assert len(store) == 3
        assert store.recovered is None and store.path.read_bytes() == complete + partial  # repaired by 1st append
        store.append(make_row(3))  # the store keeps working after recovery
        assert store.path.read_bytes() == complete + (json.dumps(make_row(3)) + "\n").encode()
        assert "partial last line" in store.recovered and "3 finished rows" in store.recovered
        saved = list(tmp_path.glob("results.jsonl.partial-*"))
        assert len(saved) == 1 and saved[0].read_bytes() == partial
        assert saved[0].name.startswith(f"results.jsonl.partial-{os.getpid()}-")  # unique per process and ns
    assert len(ResultsStore(tmp_path)) == 4


def test_invalid_last_line_with_newline_is_dropped(tmp_path):
    with ResultsStore(tmp_path) as store:
        store.append(make_row(0))
    complete = store.path.read_bytes()
    store.path.write_bytes(complete + b"garbage\n")
    with ResultsStore(tmp_path) as store:
        store.append(make_row(1))
        assert len(store) == 2 and store.path.read_bytes().startswith(complete + b"{") and store.recovered


def test_complete_last_line_without_newline_is_kept(tmp_path):
    with ResultsStore(tmp_path) as store:
        for i in range(2):
            store.append(make_row(i))
    store.path.write_bytes(store.path.read_bytes().rstrip(b"\n"))

    with ResultsStore(tmp_path) as store:
        assert len(store) == 2
        store.append(make_row(2))
        assert "newline" in store.recovered
        assert not list(tmp_path.glob("results.jsonl.partial-*"))
    assert [r["item"] for r in ResultsStore(tmp_path).rows()] == [0, 1, 2]


def test_corrupt_middle_line_raises_and_file_untouched(tmp_path):
    lines = [json.dumps(make_row(i)) for i in range(3)]
    lines[1] = lines[1][:20]
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(lines) + "\n" + '{"partial', encoding="utf-8")
    before = path.read_bytes()
    with pytest.raises(ResultsError, match="line 2"):
        ResultsStore(tmp_path)
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("results.jsonl.partial-*"))


def test_duplicate_keys_in_file_keep_first(tmp_path):
    path = tmp_path / "results.jsonl"
    text = "".join(json.dumps(r) + "\n" for r in [make_row(0, score=1.0), make_row(1), make_row(0, score=2.0)])
    path.write_text(text, encoding="utf-8")
    with ResultsStore(tmp_path) as store:
        assert [(r["item"], r["score"]) for r in store.rows()] == [(0, 1.0), (1, 100.0)]
    assert path.read_text(encoding="utf-8") == text
    read = read_results(tmp_path)
    assert [(r["item"], r["score"]) for r in read.rows] == [(0, 1.0), (1, 100.0)]
    assert any("more than once" in n for n in read.notes)


def test_unwritable_directory_raises(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ResultsError, match="--out"):
        ResultsStore(tmp_path / "afile" / "sub")


def test_manifest_runs_and_fingerprint_clash(tmp_path):
    store = ResultsStore(tmp_path)
    assert store.manifest() == {"runs": []}
    store.write_manifest({"model": "qwen", "model_fingerprint": "abc", "seed": 0})
    store.write_manifest({"model": "qwen", "model_fingerprint": "abc", "seed": 1})
    store.write_manifest({"model": "other", "model_fingerprint": "zzz", "seed": 0})
    assert [r["seed"] for r in store.manifest()["runs"]] == [0, 1, 0]

    before = store.manifest_path.read_bytes()
    with pytest.raises(ResultsError, match="--out"):
        store.write_manifest({"model": "qwen", "model_fingerprint": "def", "seed": 2})
    assert store.manifest_path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp" in p.name) == []


def test_corrupt_manifest_raises_and_is_kept(tmp_path):
    store = ResultsStore(tmp_path)
    store.manifest_path.write_text('{"runs": [', encoding="utf-8")
    with pytest.raises(ResultsError, match="manifest.json"):
        store.write_manifest({"model": "m", "model_fingerprint": "x"})
    assert store.manifest_path.read_text(encoding="utf-8") == '{"runs": ['


text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
rows_strategy = st.lists(
    st.fixed_dictionaries(
        {
            "model": st.sampled_from(["a", "b"]),
            "engine": st.just("e"),
            "method": st.sampled_from(["full", "snapkv", "knorm"]),
            "allocation": text,
            "p": st.floats(0, 1),
            "bench": st.just("b"),
            "task": text,
            "item": st.integers(0, 3),
            "question": text,
            "length": st.sampled_from([512, 1024]),
            "seed": st.integers(0, 2),
            "context_sha256": st.sampled_from(["ab", "cd"]),
            "model_fingerprint": st.just("f"),
            "artifact_sha256": st.sampled_from([None, "a1"]),
            "score": st.floats(allow_nan=False, allow_infinity=False),
            "pred": text,
        }
    ),
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(rows_strategy)
def test_store_reload_round_trip_property(rows):
    unique = {}
    for r in rows:
        unique.setdefault(row_key(r), {**r, "p": round(r["p"], 4)})
    expected = list(unique.values())
    with tempfile.TemporaryDirectory() as d:
        with ResultsStore(d) as store:
            for r in expected:
                store.append(r)
        assert ResultsStore(d).rows() == expected


# --- one writer per results file, readers that never write (issue 17 items 2-4) -------------------------

_WRITER = r"""
import os, sys, time
from kvbench.results.store import ResultsStore
sys.path.insert(0, {tests!r})
from test_results import make_row
out, shard, mode = sys.argv[1], tuple(int(x) for x in sys.argv[2].split("/")), sys.argv[3]
if mode == "slow-writes":  # every row reaches the file in two writes: readers see half-written lines
    real = os.write
    def halves(fd, buf):
        if len(buf) > 8:
            n = real(fd, bytes(buf[: len(buf) // 2]))
            time.sleep(0.0005)
            return n
        return real(fd, buf)
    os.write = halves
with ResultsStore(out, shard) as store:
    print("open", flush=True)
    if mode == "hold":
        sys.stdin.readline()
    elif mode == "manifest":
        for i in range(int(sys.argv[4])):
            store.write_manifest({{"model": "m", "model_fingerprint": "f", "entry": f"{{shard}}-{{i}}"}})
            store.record_missing("b", f"{{shard}}-{{i}}", "absent")
    else:
        i = 0
        while not os.path.exists(os.path.join(out, "stop")) or i < 50:
            store.append(make_row(i, task=sys.argv[2]))
            i += 1
        print(i, flush=True)
"""


def spawn(out, shard: str = "0/1", mode: str = "append", *extra: str) -> subprocess.Popen:
    """A writer process on ``out``; it prints "open" once it holds the lock."""
    code = _WRITER.format(tests=str(Path(__file__).parent))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(out), shard, mode, *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = proc.stdout.readline().strip()
    assert line == "open", proc.stderr.read()
    return proc


def test_second_writer_is_refused_naming_the_holder(tmp_path):
    holder = spawn(tmp_path, mode="hold")
    try:
        with pytest.raises(ResultsError, match=rf"being written by another kvbench run, pid {holder.pid} "):
            ResultsStore(tmp_path)
        with ResultsStore(tmp_path, (1, 2)) as other_shard:  # other files of the directory stay writable
            other_shard.append(make_row(5))
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    with ResultsStore(tmp_path) as store:  # the lock went with its process
        assert store.is_done(make_row(5)) and not store.rows()


def test_same_process_second_writer_is_refused(tmp_path):
    with ResultsStore(tmp_path) as first:
        with pytest.raises(ResultsError, match=f"pid {os.getpid()} "):
            ResultsStore(tmp_path)
        first.append(make_row(0))
    with ResultsStore(tmp_path) as again:
        assert len(again) == 1


def test_a_reader_racing_a_writer_50_times_loses_no_row(tmp_path):
    """Each of 50 or more reads during the writes sees a prefix of the writer's rows (half-written lines skipped and
    noted); the file ends with every row once, nothing set aside."""
    writer = spawn(tmp_path, "0/1", "slow-writes")
    seen, noted = [], 0
    try:
        path, deadline = tmp_path / "results.jsonl", time.monotonic() + 120
        while not (path.exists() and b"\n" in path.read_bytes()) and time.monotonic() < deadline:
            time.sleep(0.01)  # the writer starts up (imports) before its first row: read once it writes
        deadline = time.monotonic() + 60  # 50 reads at least; more when a loaded machine starves the writer
        while len(seen) < 50 or ((len(set(seen)) < 2 or not noted) and time.monotonic() < deadline):
            read = read_results(tmp_path)
            items = [r["item"] for r in read.rows]
            assert items == list(range(len(items)))
            seen.append(len(items))
            noted += any("incomplete last line" in n for n in read.notes)
    finally:
        (tmp_path / "stop").write_text("")
        out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err
    written = int(out.split()[-1])
    final = read_results(tmp_path)
    assert [r["item"] for r in final.rows] == list(range(written)) and not final.notes
    assert seen == sorted(seen) and seen[-1] <= written and len(set(seen)) > 1  # reads overlapped the writes
    assert noted >= 1  # some reads met a half-written last line (about half of them do) and skipped it
    assert not list(tmp_path.glob("*.partial-*"))


def test_shards_write_one_directory_at_once_and_readers_merge_them(tmp_path):
    writers = [spawn(tmp_path, f"{i}/2", "append") for i in range(2)]
    (tmp_path / "stop").write_text("")
    counts = [int(w.communicate(timeout=120)[0].split()[-1]) for w in writers]
    assert sorted(p.name for p in tmp_path.glob("results*.jsonl")) == [
        "results.shard-0-of-2.jsonl", "results.shard-1-of-2.jsonl"
    ]  # fmt: skip
    rows = read_results(tmp_path).rows
    assert sorted((r["task"], r["item"]) for r in rows) == sorted(
        (f"{i}/2", j) for i in range(2) for j in range(counts[i])
    )
    with ResultsStore(tmp_path) as unsharded:  # a later unsharded run skips what the shards did
        assert unsharded.is_done(make_row(0, task="1/2")) and len(unsharded) == 0


def test_concurrent_manifest_and_missing_updates_lose_nothing(tmp_path):
    writers = [spawn(tmp_path, f"{i}/2", "manifest", "25") for i in range(2)]
    for w in writers:
        assert w.communicate(timeout=120)[0].strip() == "", w.stderr
        assert w.returncode == 0
    with ResultsStore(tmp_path) as store:
        entries = sorted(r["entry"] for r in store.manifest()["runs"])
        assert entries == sorted(f"({i}, 2)-{j}" for i in range(2) for j in range(25))
        assert len(store.missing()) == 50
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_reader_never_writes_and_notes_an_incomplete_last_line(tmp_path):
    with ResultsStore(tmp_path) as store:
        for i in range(3):
            store.append(make_row(i))
    data = store.path.read_bytes() + b'{"model": "m", "eng'
    store.path.write_bytes(data)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    os.chmod(tmp_path, 0o555)  # a read-only directory (root ignores it: the snapshot check below does not)
    try:
        read = read_results(tmp_path)
    finally:
        os.chmod(tmp_path, 0o755)
    assert [r["item"] for r in read.rows] == [0, 1, 2]
    assert len(read.notes) == 1 and "incomplete last line" in read.notes[0] and "results.jsonl" in read.notes[0]
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()} == before


def test_reader_refuses_corruption_and_an_empty_directory(tmp_path):
    with pytest.raises(ResultsError, match="kvbench run --out"):
        read_results(tmp_path)
    lines = [json.dumps(make_row(i)) for i in range(3)]
    lines[1] = "garbage"
    (tmp_path / "results.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ResultsError, match="line 2"):
        read_results(tmp_path)


def test_legacy_rows_are_never_reused(tmp_path):
    """Rows without length/seed/context_sha256/model_fingerprint: a writer refuses the file (naming the fix), and
    a writer of another results file of the directory too (issue 34); a reader leaves them out and says so."""
    legacy = {k: v for k, v in make_row(0).items() if k not in ("length", "model_fingerprint")}
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(legacy) + "\n" + json.dumps(legacy | {"item": 1}) + "\n")
    before = sorted(tmp_path.iterdir())
    with pytest.raises(ResultsError, match="2 rows of an older kvbench.*new --out"):
        ResultsStore(tmp_path)
    with pytest.raises(ResultsError, match=f"{path} holds 2 rows of an older kvbench"):  # not "being written"
        ResultsStore(tmp_path, (0, 2))
    assert sorted(tmp_path.iterdir()) == before and path.read_text().count("\n") == 2  # no lock, no shard file
    read = read_results(tmp_path)
    assert read.rows == [] and len(read.notes) == 1 and "left out 2 rows" in read.notes[0]


def test_rows_without_an_artifact_digest_are_legacy(tmp_path):
    """Rows of the previous release (every field of the key but ``artifact_sha256``) could stand for a replaced
    calibration: refused by a writer, left out by a reader, like older legacy rows."""
    old = {k: v for k, v in make_row(0, method="gatesight").items() if k != "artifact_sha256"}
    (tmp_path / "results.jsonl").write_text(json.dumps(old) + "\n")
    with pytest.raises(ResultsError, match="1 rows of an older kvbench.*artifact_sha256.*new --out"):
        ResultsStore(tmp_path)
    read = read_results(tmp_path)
    assert read.rows == [] and "left out 1 rows" in read.notes[0]


def test_recorded_artifacts_per_model_and_method(tmp_path):
    with ResultsStore(tmp_path, (1, 2)) as other:
        other.append(make_row(0, method="gatesight", artifact_sha256="aa"))
    with ResultsStore(tmp_path, (0, 2)) as store:
        store.append(make_row(1, method="gatesight", artifact_sha256="bb"))
        store.append(make_row(2))
        store.append(make_row(3, method="gatesight", artifact_sha256="cc", model_fingerprint="ef" * 32))
        assert store.recorded_artifacts("m", "cd" * 32) == {"gatesight": {"aa", "bb"}, "snapkv": {"None"}}
        assert store.recorded_artifacts("m", "ef" * 32) == {"gatesight": {"cc"}}
        assert store.recorded_artifacts("x", "cd" * 32) == {}


def test_full_disk_names_the_file_and_leaves_it_resumable(tmp_path, monkeypatch):
    import errno

    import kvbench.results.store as results_store

    with ResultsStore(tmp_path) as store:
        store.append(make_row(0))
        before = store.path.read_bytes()
        real = os.write
        calls = []

        def full_disk(fd, buf):
            calls.append(len(buf))
            if len(calls) == 1:
                return real(fd, bytes(buf[:10]))  # part of the row reaches the disk, then it is full
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(results_store.os, "write", full_disk)
        with pytest.raises(ResultsError) as info:
            store.append(make_row(1))
        monkeypatch.setattr(results_store.os, "write", real)
        message = str(info.value)
        assert str(store.path) in message and "disk is full" in message and "rerun the same command" in message
        assert store.path.read_bytes() == before  # the partial row was cut back off
    with ResultsStore(tmp_path) as again:
        assert again.recovered is None and not again.is_done(make_row(1))
        again.append(make_row(1))
    assert [r["item"] for r in read_results(tmp_path).rows] == [0, 1]


def test_results_file_that_is_a_directory(tmp_path):
    (tmp_path / "results.jsonl").mkdir()
    with pytest.raises(ResultsError, match="is a directory"):
        ResultsStore(tmp_path)
    with pytest.raises(ResultsError, match="is a directory"):
        read_results(tmp_path)
