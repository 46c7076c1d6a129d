"""Rows record the calibration artifact they were scored with (``artifact_sha256``, part of their identity):
the digest is that of the very file a method reads, a rerun after a recalibration never reuses or mixes the
older rows, and a report reading two calibrations together shows them apart."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from kvbench import artifacts, models
from kvbench.errors import KvbenchError
from kvbench.methods import get_method
from kvbench.methods.gatesight.estimator import ARTIFACT_ENV, WEIGHTS_FILE, load_artifact, save_artifact
from kvbench.methods.triattention import TriAttention, TriAttentionStats, load_stats, save_stats
from kvbench.report.data import frame, load
from kvbench.results.read import read_results
from kvbench.results.store import ResultsStore
from tests.test_cli import kvbench
from tests.test_results import make_row

RUN = ("run", "--bench", "ruler", "--task", "niah_single_1", "--limit", "1", "--p", "0.5", "--no-reference")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shipped(method: str, lm) -> Path:
    """The shipped artifact file of ``method`` for the default model."""
    if method == "gatesight":
        return get_method("gatesight").resolve_artifact(_Fp(lm.fingerprint)) / WEIGHTS_FILE
    return get_method("triattention").resolve_stats_path(_Fp(lm.fingerprint))


class _Fp:
    """Stands in for a parent whose only known property is the model fingerprint."""

    def __init__(self, fingerprint: str) -> None:
        self.model_fingerprint = fingerprint


@pytest.fixture(scope="module")
def default_lm():
    return models.load_model()


def test_methods_without_artifacts_record_none(default_lm):
    for name in ("full", "random", "snapkv", "keydiff", "kvzip", "oracle"):
        assert get_method(name).artifact_sha256(default_lm.fingerprint) is None, name


def test_the_digest_is_that_of_the_file_read(default_lm, monkeypatch, tmp_path):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))  # nothing of the user's own: the shipped files
    monkeypatch.delenv(ARTIFACT_ENV, raising=False)
    fp = default_lm.fingerprint
    for name in ("gatesight", "triattention"):
        path = shipped(name, default_lm)
        assert str(path).startswith(str(artifacts.SHIPPED_CALIBRATION))
        assert get_method(name).artifact_sha256(fp) == sha256_of(path), name
    # another model's fingerprint: the same error as scoring would give, before anything runs
    with pytest.raises(KvbenchError, match="gatesight label"):
        get_method("gatesight").artifact_sha256("0" * 64)


def test_a_method_scores_with_the_artifact_whose_digest_it_gave(default_lm, monkeypatch, tmp_path):
    """The file replaced after the digest was taken: the instance keeps scoring with what it read."""
    from kvbench.engines.torch_engine import TorchEngine

    fp = default_lm.fingerprint
    copy = tmp_path / "gs"
    shutil.copytree(shipped("gatesight", default_lm).parent, copy)
    monkeypatch.setenv(ARTIFACT_ENV, str(copy))
    method = get_method("gatesight")
    digest = method.artifact_sha256(fp)
    parent = TorchEngine(default_lm.model, default_lm.tokenizer, fingerprint=fp).prefill(list(range(10, 200)), prot=4)
    try:
        before = method.score(parent)
        est = load_artifact(copy, fp)
        with torch.no_grad():
            est.w2[0].mul_(-1)
        save_artifact(est, copy)  # a recalibration in place
        assert sha256_of(copy / WEIGHTS_FILE) != digest
        after = method.score(parent)
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        assert method.artifact_sha256(fp) == digest
        fresh = get_method("gatesight")  # a new run reads the new file
        assert fresh.artifact_sha256(fp) == sha256_of(copy / WEIGHTS_FILE)
        assert not torch.equal(fresh.score(parent)[0], before[0])
    finally:
        parent.release()


def test_in_memory_statistics_digest_equals_their_saved_file(default_lm, tmp_path):
    stats = load_stats(shipped("triattention", default_lm), default_lm.fingerprint)
    fresh = TriAttentionStats(stats.q_mean_re, stats.q_mean_im, stats.q_abs_mean, stats.omega,
                              {k: v for k, v in stats.metadata.items() if k != "format"})  # fmt: skip
    path = save_stats(fresh, tmp_path / "tri.safetensors")
    assert fresh.sha256 == sha256_of(path) == load_stats(path, default_lm.fingerprint).sha256
    assert TriAttention(stats=fresh).artifact_sha256(default_lm.fingerprint) == fresh.sha256
    bumped = TriAttentionStats(stats.q_mean_re + 1e-3, stats.q_mean_im, stats.q_abs_mean, stats.omega, fresh.metadata)
    assert bumped.sha256 != fresh.sha256


def test_rerun_after_a_recalibration_refuses_to_mix(default_lm, tmp_path, monkeypatch, capsys):
    """Rows record the digest and the manifest lists it; a rerun into the same --out with a replaced
    GateSight artifact exits 2 naming the fix and changes nothing; a new --out runs; the report of both
    directories shows the two calibrations apart."""
    monkeypatch.delenv(ARTIFACT_ENV, raising=False)
    fp = default_lm.fingerprint
    out = tmp_path / "out"
    assert kvbench(*RUN, "--method", "gatesight,snapkv", "--out", str(out)) == 0, capsys.readouterr().err
    rows = read_results(out).rows
    first = sha256_of(shipped("gatesight", default_lm))
    assert {(r["method"], r["artifact_sha256"]) for r in rows} == {("gatesight", first), ("snapkv", None)}
    assert f"gatesight scores with the artifact of sha256 {first[:16]}" in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runs"][0]["artifacts"] == {"gatesight": first, "snapkv": None}

    recalibrated = tmp_path / "recalibrated"
    est = load_artifact(shipped("gatesight", default_lm).parent, fp)
    with torch.no_grad():
        est.w2[1].mul_(-1)  # other weights, same shapes
    save_artifact(est, recalibrated)
    monkeypatch.setenv(ARTIFACT_ENV, str(recalibrated))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and not p.name.endswith(".lock")}
    capsys.readouterr()
    assert kvbench(*RUN, "--method", "gatesight,snapkv", "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert "scored with another artifact" in err and "new --out" in err and first[:12] in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and not p.name.endswith(".lock")} == before

    out2 = tmp_path / "out2"
    assert kvbench(*RUN, "--method", "gatesight", "--out", str(out2)) == 0, capsys.readouterr().err
    second = sha256_of(recalibrated / WEIGHTS_FILE)
    assert {r["artifact_sha256"] for r in read_results(out2).rows} == {second}

    df, _, notes = load([out, out2])
    gs = df[df.method.astype(str).str.startswith("gatesight")]
    assert set(gs.method.astype(str)) == {f"gatesight@{first[:8]}", f"gatesight@{second[:8]}"}
    assert set(df[df.method == "snapkv"].label) == {"snapkv [flat]"}  # one artifact (none): unchanged
    assert any("2 different artifacts" in n and "gatesight" in n for n in notes)


def test_missing_artifact_fails_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ARTIFACT_ENV, str(tmp_path / "nowhere"))
    out = tmp_path / "out"
    assert kvbench(*RUN, "--method", "snapkv,gatesight", "--out", str(out)) == 2
    assert "no GateSight artifact" in capsys.readouterr().err
    assert not out.exists()  # not even the directory (issue 34)


def test_frame_splits_one_method_of_two_artifacts_only():
    rows = [make_row(i, method="gatesight", allocation="gate", artifact_sha256=sha, real_fork=True)
            for i, sha in enumerate(["ab" * 32, "cd" * 32, "cd" * 32])]  # fmt: skip
    rows += [make_row(i, method="gatesight", allocation="gate", artifact_sha256="ef" * 32, model="other")
             for i in range(2)]  # fmt: skip
    df = frame(rows)
    assert list(df.label.astype(str)) == [
        "gatesight@abababab [gate]",
        "gatesight@cdcdcdcd [gate]",
        "gatesight@cdcdcdcd [gate]",
        "gatesight [gate]",
        "gatesight [gate]",
    ]


def test_a_bad_digest_from_a_third_party_method_is_refused(tmp_path, monkeypatch, capsys):
    from kvbench.methods.snapkv import SnapKV

    monkeypatch.setattr(SnapKV, "artifact_sha256", lambda self, fp: 42)
    assert kvbench(*RUN, "--method", "snapkv", "--out", str(tmp_path / "o")) == 2
    assert "artifact_sha256() returned 42" in capsys.readouterr().err


def test_store_keeps_rows_of_each_artifact_apart(tmp_path):
    with ResultsStore(tmp_path) as store:
        store.append(make_row(0, artifact_sha256="aa"))
        assert not store.is_done(make_row(0, artifact_sha256="bb"))
        assert store.is_done(make_row(0, artifact_sha256="aa"))
