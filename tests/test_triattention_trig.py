"""``triattention.trig``: the reference's ``disable_trig`` ablation (the score keeps only the MLR term), checked on a
hand-worked example and against the reference's own form of the score (RoPE inverted per key, amplitude and
phase per band); and ``TriAttention.calibrate``, the method's offline calibration step."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kvbench.errors import KvbenchError
from kvbench.methods import get_method, parse_method_options
from kvbench.methods.triattention import (
    TriAttention,
    TriAttentionStats,
    calibrate,
    default_stats_path,
    geometric_offsets,
    load_stats,
    trig_scores,
)
from tests.fakes import FakeParent
from tests.test_cli import kvbench

THETA = 10000.0
# D = 8, R = 4: rotated bands (0, 2) and (1, 3) at ω = 1 and 1/100, pass-through bands (4, 6) and (5, 7) at ω = 0
D, R = 8, 4
BANDS = [(0, 2), (1, 3), (4, 6), (5, 7)]
OMEGA = [1.0, 1.0 / THETA ** (2 / R), 0.0, 0.0]


def stats_of(q_re, q_im, q_abs, fingerprint: str = "f" * 64) -> TriAttentionStats:
    """Statistics ``[L, H, 4]`` of the D = 8, R = 4 layout."""
    meta = {"fingerprint": fingerprint, "head_dim": D, "rotary_dim": R}
    return TriAttentionStats(q_re, q_im, q_abs, torch.tensor(OMEGA, dtype=torch.float64), meta)


def random_stats(L: int, H: int, seed: int) -> TriAttentionStats:
    g = torch.Generator().manual_seed(seed)
    q_re, q_im = torch.randn(L, H, 4, generator=g), torch.randn(L, H, 4, generator=g)
    q_abs = torch.hypot(q_re, q_im) + torch.rand(L, H, 4, generator=g)  # E|q| >= |E q|
    return stats_of(q_re, q_im, q_abs)


def reference_form(keys, q_re, q_im, q_abs, round_start, offsets, *, trig=True, aggregation="mean"):
    """[H, n] float64, as the reference scores (triattention/methods/pruning_utils.py,
    ``compute_frequency_statistics_from_means`` and ``score_keys_for_round``): the key at position p un-rotated
    band by band (k_b e^{-jω_b p}), amp = |q̄_b||k_b|, φ = arg(q̄_b conj k_b), extra = (E|q_b| - |q̄_b|)|k_b|;
    per offset Σ_b amp cos(ω_b (round_start + o - p) + φ) (left out with ``disable_trig``) + Σ_b extra."""
    H_kv, n, _ = keys.shape
    H = q_re.shape[0]
    out = torch.zeros(H, n, dtype=torch.float64)
    for h in range(H):
        for p in range(n):
            k = keys[h // (H // H_kv), p].double().tolist()
            per_offset = []
            for o in offsets:
                total = 0.0
                for b, (re, im) in enumerate(BANDS):
                    kb = complex(k[re], k[im]) * complex(math.cos(-OMEGA[b] * p), math.sin(-OMEGA[b] * p))
                    qb = complex(float(q_re[h, b]), float(q_im[h, b]))
                    if trig:
                        phi = math.atan2((qb * kb.conjugate()).imag, (qb * kb.conjugate()).real)
                        total += abs(qb) * abs(kb) * math.cos(OMEGA[b] * (round_start + o - p) + phi)
                    total += (float(q_abs[h, b]) - abs(qb)) * abs(kb)
                per_offset.append(total)
            out[h, p] = sum(per_offset) / len(per_offset) if aggregation == "mean" else max(per_offset)
    return out


def rope(key_unrot: list[float], p: int) -> list[float]:
    """The stored (post-RoPE) key at position p of an un-rotated key (rotate_half on the first R dims)."""
    y = list(key_unrot)
    for b, (re, im) in enumerate(BANDS[:2]):
        c, s = math.cos(OMEGA[b] * p), math.sin(OMEGA[b] * p)
        y[re], y[im] = key_unrot[re] * c - key_unrot[im] * s, key_unrot[im] * c + key_unrot[re] * s
    return y


@pytest.mark.parametrize("aggregation", ["mean", "max"])
def test_trig_false_by_hand(aggregation):
    """Band centres 3+4j, 0, 1, 2j (|q̄| 5, 0, 1, 2) with E|q| 6, 1, 3, 2 weigh the band magnitudes by 1, 1, 2, 0;
    key 0 has band magnitudes 5, 0, 1, 7 -> 7; key 1 has 1, 2, 2, 0 -> 7; key 2 has 0, 0, 0, 3 -> 0. Rotating a key
    to its position does not change its band magnitudes, and no position or offset enters."""
    q_re = torch.tensor([[[3.0, 0.0, 1.0, 0.0]]])
    q_im = torch.tensor([[[4.0, 0.0, 0.0, 2.0]]])
    q_abs = torch.tensor([[[6.0, 1.0, 3.0, 2.0]]])
    unrot = [[3.0, 0.0, 4.0, 0.0, 1.0, 0.0, 0.0, 7.0], [0.0, 2.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0], [0.0] * 7 + [3.0]]
    keys = torch.tensor([[rope(k, p) for p, k in enumerate(unrot)]])  # [1, 3, 8]
    stats = stats_of(q_re, q_im, q_abs)
    args = (keys, stats.q_mean_re[0], stats.q_mean_im[0], stats.q_abs_mean[0], stats.omega, R)
    for round_start in (3, 5000):
        got = trig_scores(*args, round_start=round_start, aggregation=aggregation, trig=False)
        torch.testing.assert_close(got, torch.tensor([[7.0, 7.0, 0.0]]), rtol=1e-6, atol=1e-5)
    # with the trigonometric term the scores move (key 2: the pass-through centre 2j against 3j is 6)
    with_trig = trig_scores(*args, round_start=3, aggregation=aggregation)
    assert float(with_trig[0, 2]) == pytest.approx(6.0, abs=1e-5)
    # the rotated bands only: key 0 keeps 5 (band 0), key 1 keeps 1 + 2 (bands 0, 1), key 2 none
    rotated = trig_scores(*args, round_start=3, aggregation=aggregation, trig=False, zero_freq_bands=False)
    torch.testing.assert_close(rotated, torch.tensor([[5.0, 3.0, 0.0]]), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("aggregation", ["mean", "max"])
@pytest.mark.parametrize("trig", [True, False])
def test_trig_scores_match_the_reference_form(trig, aggregation):
    H, H_kv, n, round_start = 4, 2, 15, 40
    stats = random_stats(1, H, seed=1)
    keys = torch.randn(H_kv, n, D, generator=torch.Generator().manual_seed(2))
    offsets = geometric_offsets(4096)
    q = (stats.q_mean_re[0], stats.q_mean_im[0], stats.q_abs_mean[0])
    got = trig_scores(keys, *q, stats.omega, R, round_start=round_start, offsets=offsets, aggregation=aggregation,
                      trig=trig)  # fmt: skip
    want = reference_form(keys, *q, round_start, offsets, trig=trig, aggregation=aggregation)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_trig_option_through_get_method():
    L, H, H_kv, n, prot = 2, 4, 2, 20, 3
    stats = random_stats(L, H, seed=3)
    g = torch.Generator().manual_seed(4)
    parent = FakeParent([torch.randn(H_kv, n, D, generator=g) for _ in range(L)], n_heads=H, prot=prot)
    assert parse_method_options(["triattention.trig=false"]) == {"triattention": {"trig": "false"}}
    method = get_method("triattention", options={"trig": "false"})
    assert method.label == "triattention[trig=false]" and method.method_options() == {"trig": False}
    assert get_method("triattention", options={"trig": "true"}).label == "triattention"
    assert TriAttention.trig is True  # the default keeps the trigonometric term
    method.stats = stats
    got = method.score(parent)
    for f in range(L):
        raw = reference_form(parent.keys(f), stats.q_mean_re[f], stats.q_mean_im[f], stats.q_abs_mean[f], n, [1],
                             trig=False)  # fmt: skip
        body = raw[:, prot:]
        z = (raw - body.mean(1, keepdim=True)) / body.std(1, unbiased=False, keepdim=True)
        want = torch.stack([torch.maximum(z[2 * k], z[2 * k + 1]) for k in range(H_kv)])
        torch.testing.assert_close(got[f].double(), want, rtol=1e-4, atol=1e-4)
    with_trig = get_method("triattention")
    with_trig.stats = stats
    assert any(float((a - b).abs().max()) > 1e-2 for a, b in zip(with_trig.score(parent), got, strict=True))


def test_trig_and_mlr_both_off_is_refused():
    with pytest.raises(KvbenchError, match=r"^--set triattention\.trig=false .* nothing to score; keep one of them$"):
        get_method("triattention", options={"trig": "false", "mlr": "false"})
    keys = torch.randn(1, 3, D)
    stats = random_stats(1, 1, seed=5)
    message = "^TriAttention with neither the trigonometric nor the MLR term has nothing to score$"
    with pytest.raises(KvbenchError, match=message):
        trig_scores(keys, stats.q_mean_re[0], stats.q_mean_im[0], stats.q_abs_mean[0], stats.omega, R, round_start=3,
                    trig=False, mlr=False)  # fmt: skip


def test_calibrate_classmethod_saves_and_rows_record_the_trig_option(tmp_path, monkeypatch, capsys):
    """``TriAttention.calibrate`` equals the module's :func:`calibrate` cut to the model's trained length, saved
    at the default path (or ``out``); a run with ``--set triattention.trig=false`` then labels its rows."""
    from kvbench.models import load_model

    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    lm = load_model("tiny-random")
    lm.context_length = 30
    texts = ["the quick brown fox jumps over the lazy dog " * 3, "pack my box with five dozen liquor jugs " * 3]
    path = TriAttention.calibrate(lm, texts, max_tokens=50)
    assert path == default_stats_path(lm.fingerprint)
    got = load_stats(path, lm.fingerprint)
    want = calibrate(lm.model, lm.tokenizer, texts, max_tokens=50, max_len=30, fingerprint=lm.fingerprint)
    assert torch.equal(got.q_mean_re, want.q_mean_re) and torch.equal(got.q_abs_mean, want.q_abs_mean)
    meta = json.loads(path.with_suffix(".json").read_text())
    assert (meta["n_tokens"], meta["n_documents"], meta["max_len"]) == (50, 2, 30)
    other = TriAttention.calibrate(lm, texts, max_tokens=20, out=tmp_path / "other.safetensors")
    assert other == tmp_path / "other.safetensors" and load_stats(other, lm.fingerprint).metadata["n_tokens"] == 20

    out = tmp_path / "run"
    args = ["run", "--model", "tiny-random", "--method", "triattention", "--set", "triattention.trig=false"]
    args += ["--p", "0.3", "--no-reference", "--limit", "1", "--length", "900", "--out", str(out)]
    assert kvbench(*args) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert rows and {r["method"] for r in rows} == {"triattention[trig=false]"}
    assert all(r["method_options"] == {"trig": False} for r in rows)
