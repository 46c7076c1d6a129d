"""The no-prune reference every ``kvbench run`` adds (method ``full``, ``--no-reference`` leaves it out): it resumes
into results written without it, leaves the other methods' rows as they were, runs once per context whatever
``--p``, and the manifest records it."""

from __future__ import annotations

import json

from tests.test_cli import LENGTH, MODEL, kvbench, read_rows

RUN = ["run", *MODEL, "--limit", "2", "--length", LENGTH]


def _key(row: dict) -> tuple:
    return (row["method"], row["allocation"], row["p"], row["task"], row["item"], row["question"])


def test_reference_resumes_into_results_written_without_it(tmp_path, capsys):
    out = tmp_path / "run"
    args = [*RUN, "--method", "random", "--p", "0.5", "--out", str(out)]
    assert kvbench(*args, "--no-reference") == 0, capsys.readouterr().err
    before = (out / "results.jsonl").read_text()
    old = read_rows(out)
    assert {r["method"] for r in old} == {"random"}
    capsys.readouterr()

    assert kvbench(*args) == 0, capsys.readouterr().err
    err = capsys.readouterr().err.replace("\n", " ")
    rows = read_rows(out)
    assert (out / "results.jsonl").read_text().startswith(before)  # the old rows stay, byte for byte
    added = rows[len(old) :]
    assert {r["method"] for r in added} == {"full"} and all(r["p"] == 1.0 for r in added)
    assert {(r["item"], r["question"]) for r in added} == {(r["item"], r["question"]) for r in old}
    assert f"{len(added)} rows written, {len(old)} already present" in err

    # a third run has nothing left to do
    assert kvbench(*args) == 0
    assert f"0 rows written, {len(rows)} already present" in capsys.readouterr().err.replace("\n", " ")


def test_reference_leaves_the_other_rows_unchanged(tmp_path, capsys):
    """Same prefill, same seeds, same answers: the random method's rows with and without the reference agree."""
    plain, ref = tmp_path / "plain", tmp_path / "ref"
    assert kvbench(*RUN, "--method", "random", "--p", "0.5,0.1", "--no-reference", "--out", str(plain)) == 0
    assert kvbench(*RUN, "--method", "random", "--p", "0.5,0.1", "--out", str(ref)) == 0, capsys.readouterr().err
    fields = ("prediction", "score", "kept_entries", "n_context", "context_sha256")
    want = {_key(r): [r[f] for f in fields] for r in read_rows(plain)}
    got = {_key(r): [r[f] for f in fields] for r in read_rows(ref) if r["method"] != "full"}
    assert got == want and len(want) == 2 * len({(k[3], k[4], k[5]) for k in want})


def test_reference_runs_once_per_context_and_never_twice(tmp_path, capsys):
    """Listed by the user or added, ``full`` has one row per question at p = 1.0 whatever --p, and the manifest
    records the methods run and the setting."""
    for name, methods in [("listed", "full,random"), ("added", "random")]:
        out = tmp_path / name
        assert kvbench(*RUN, "--method", methods, "--p", "0.9,0.5,0.1", "--out", str(out)) == 0, capsys.readouterr().err
        rows = read_rows(out)
        full = [r for r in rows if r["method"] == "full"]
        questions = {(r["task"], r["item"], r["question"]) for r in rows}
        assert len(full) == len(questions) and {r["p"] for r in full} == {1.0}
        assert len({_key(r) for r in rows}) == len(rows)
        entry = json.loads((out / "manifest.json").read_text())["runs"][0]
        assert entry["config"]["reference"] is True
        assert entry["methods"] == (["full", "random"] if name == "listed" else ["random", "full"])
    out = tmp_path / "none"
    assert kvbench(*RUN, "--method", "random", "--p", "0.5", "--no-reference", "--out", str(out)) == 0
    entry = json.loads((out / "manifest.json").read_text())["runs"][0]
    assert entry["methods"] == ["random"] and entry["config"]["reference"] is False
    assert not [r for r in read_rows(out) if r["method"] == "full"]
