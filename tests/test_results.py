"""ResultsStore: round trip, resume keys, crash recovery, refusal of corruption, manifest."""

import json
import math
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.results import ROW_KEY, ResultsError, ResultsStore, row_key


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
    store = ResultsStore(tmp_path)
    store.append(make_row(1))
    assert store.is_done(make_row(1))
    assert store.is_done(row_key(make_row(1)))
    assert not store.is_done(make_row(2))
    assert not store.is_done(make_row(1, p=0.25))


def test_p_is_normalised(tmp_path):
    store = ResultsStore(tmp_path)
    store.append(make_row(p=0.1))
    key = list(row_key(make_row(p=0.1)))
    key[ROW_KEY.index("p")] = 0.1000000001
    assert store.is_done(tuple(key))
    assert store.is_done(make_row(p="0.10000001"))
    store.append(make_row(p=0.12345678, item=9))
    assert ResultsStore(tmp_path).rows()[1]["p"] == 0.1235


def test_duplicate_append_raises(tmp_path):
    store = ResultsStore(tmp_path)
    store.append(make_row(p=0.1))
    with pytest.raises(ResultsError, match="already"):
        store.append(make_row(p=0.1000000001, score=0.0))
    assert len(ResultsStore(tmp_path)) == 1


def test_missing_key_field_raises(tmp_path):
    row = make_row()
    del row["task"]
    with pytest.raises(ResultsError, match="task"):
        ResultsStore(tmp_path).append(row)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_raises_and_file_unchanged(tmp_path, bad):
    store = ResultsStore(tmp_path)
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

    store = ResultsStore(tmp_path)
    assert len(store) == 3
    assert store.path.read_bytes() == complete
    assert "partial last line" in store.recovered and "3 finished rows" in store.recovered
    saved = list(tmp_path.glob("results.jsonl.partial-*"))
    assert len(saved) == 1 and saved[0].read_bytes() == partial
    store.append(make_row(3))  # the store keeps working after recovery
    assert len(ResultsStore(tmp_path)) == 4


def test_invalid_last_line_with_newline_is_dropped(tmp_path):
    with ResultsStore(tmp_path) as store:
        store.append(make_row(0))
    complete = store.path.read_bytes()
    store.path.write_bytes(complete + b"garbage\n")
    store = ResultsStore(tmp_path)
    assert len(store) == 1 and store.path.read_bytes() == complete and store.recovered


def test_complete_last_line_without_newline_is_kept(tmp_path):
    with ResultsStore(tmp_path) as store:
        for i in range(2):
            store.append(make_row(i))
    store.path.write_bytes(store.path.read_bytes().rstrip(b"\n"))

    store = ResultsStore(tmp_path)
    assert len(store) == 2
    assert store.path.read_bytes().endswith(b"}\n")
    assert "newline" in store.recovered
    assert not list(tmp_path.glob("results.jsonl.partial-*"))
    store.append(make_row(2))
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
    text = "".join(
        json.dumps(r) + "\n" for r in [make_row(0, score=1.0), make_row(1), make_row(0, score=2.0)]
    )
    path.write_text(text, encoding="utf-8")
    store = ResultsStore(tmp_path)
    assert [(r["item"], r["score"]) for r in store.rows()] == [(0, 1.0), (1, 100.0)]
    assert path.read_text(encoding="utf-8") == text


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
    assert [r["seed"] for r in ResultsStore(tmp_path).manifest()["runs"]] == [0, 1, 0]

    before = store.manifest_path.read_bytes()
    with pytest.raises(ResultsError, match="--out"):
        store.write_manifest({"model": "qwen", "model_fingerprint": "def", "seed": 2})
    assert store.manifest_path.read_bytes() == before
    assert not (tmp_path / "manifest.json.tmp").exists()


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
