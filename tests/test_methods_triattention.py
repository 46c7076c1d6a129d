"""TriAttention against a direct sum over future offsets of (explicitly rotated centre query) · key, and
its calibration against an independent RoPE inversion with the model's own rotary embedding."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kvbench.errors import KvbenchError
from kvbench.methods import get_method
from kvbench.methods.triattention import (
    TriAttention,
    TriAttentionStats,
    band_index,
    calibrate,
    default_stats_path,
    geometric_offsets,
    load_stats,
    trig_scores,
    zscore,
)
from kvbench.models import byte_tokenizer
from tests.conftest import tiny_model
from tests.fakes import FakeParent

THETA = 10000.0


def pairs(D: int, R: int) -> list[tuple[int, int]]:
    """(real dim, imaginary dim) of each band: rotated (i, i+R/2), then pass-through (R+j, R+P/2+j)."""
    P = D - R
    return [(i, i + R // 2) for i in range(R // 2)] + [(R + j, R + P // 2 + j) for j in range(P // 2)]


def rope(x: list[float], t: int, R: int) -> list[float]:
    """HF rotate_half RoPE at position t on the first R dims (float64), pass-through dims unchanged."""
    y = list(x)
    for i in range(R // 2):
        a = t * (1.0 / THETA ** (2 * i / R))
        c, s = math.cos(a), math.sin(a)
        y[i] = x[i] * c - x[i + R // 2] * s
        y[i + R // 2] = x[i + R // 2] * c + x[i] * s
    return y


def brute_force(keys, q_re, q_im, q_abs, R, round_start, offsets, aggregation="mean", mlr=True):
    """[H, n] float64: aggregate over o of (centre query rotated to round_start + o) · key, + MLR."""
    H_kv, n, D = keys.shape
    H = q_re.shape[0]
    G = H // H_kv
    bands = pairs(D, R)
    out = torch.zeros(H, n, dtype=torch.float64)
    for h in range(H):
        centre = [0.0] * D
        for b, (re, im) in enumerate(bands):
            centre[re], centre[im] = float(q_re[h, b]), float(q_im[h, b])
        rotated = [rope(centre, round_start + o, R) for o in offsets]
        for p in range(n):
            k = keys[h // G, p].double().tolist()
            logits = [sum(qd * kd for qd, kd in zip(q, k, strict=True)) for q in rotated]
            value = sum(logits) / len(logits) if aggregation == "mean" else max(logits)
            if mlr:
                for b, (re, im) in enumerate(bands):
                    spread = float(q_abs[h, b]) - math.hypot(float(q_re[h, b]), float(q_im[h, b]))
                    value += spread * math.hypot(k[re], k[im])
            out[h, p] = value
    return out


def random_stats(L, H, D, R, seed=0, fingerprint="f" * 64) -> TriAttentionStats:
    g = torch.Generator().manual_seed(seed)
    B = D // 2
    q_re, q_im = torch.randn(L, H, B, generator=g), torch.randn(L, H, B, generator=g)
    q_abs = torch.complex(q_re, q_im).abs() + torch.rand(L, H, B, generator=g)  # E|q| >= |E q|
    omega = torch.zeros(B, dtype=torch.float64)
    omega[: R // 2] = 1.0 / THETA ** (torch.arange(0, R, 2, dtype=torch.float64) / R)
    meta = {"fingerprint": fingerprint, "head_dim": D, "rotary_dim": R, "n_attn_layers": L, "n_heads": H}
    return TriAttentionStats(q_re, q_im, q_abs, omega, meta)


class _Config:
    def __init__(self, **fields):
        self.__dict__.update(fields)

    def get_text_config(self):
        return self


class FakeRotaryEmbedding(torch.nn.Module):
    def __init__(self, inv_freq):
        super().__init__()
        self.register_buffer("inv_freq", inv_freq)


def _model(config, *modules):
    model = torch.nn.Sequential(*modules)
    model.config = config
    return model


def test_rope_layout_reads_rope_parameters_or_the_config_and_the_applied_frequencies():
    from kvbench.methods.triattention import rope_layout

    want = torch.tensor([1.0, 0.1], dtype=torch.float64)  # theta 100, rotary_dim 4: 100 ** -(0/4, 2/4)
    info = {"rope_theta": 100.0, "partial_rotary_factor": 0.5, "rope_type": "default"}
    for config in (
        _Config(rope_parameters={"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}),
        _Config(rope_parameters={"rope_theta": 100.0}, partial_rotary_factor=0.5),  # no rope_type: the default
        _Config(rope_theta=100.0, partial_rotary_factor=0.5),  # no rope_parameters: the config's own fields
    ):
        R, inv_freq, got_info = rope_layout(_model(config), 8)
        assert (R, got_info) == (4, info)
        torch.testing.assert_close(inv_freq, want)
    R, inv_freq, got_info = rope_layout(_model(_Config(rope_theta=100.0)), 8)  # no factor: every dim rotates
    assert R == 8 and got_info["partial_rotary_factor"] == 1.0 and inv_freq.shape == (4,)
    # the frequencies the model applies (e.g. bf16-rounded) win over the config's, within 1 %; a buffer of a module
    # that is not a rotary embedding is not read
    decoy = torch.nn.Module()
    decoy.inv_freq = torch.tensor([5.0, 5.0])
    applied = torch.tensor([1.0, 0.1004])
    config = _Config(rope_theta=100.0, partial_rotary_factor=0.5)
    R, inv_freq, _ = rope_layout(_model(config, decoy, FakeRotaryEmbedding(applied)), 8)
    assert torch.equal(inv_freq, applied.double())
    for params, rope_type in (({"rope_type": "yarn", "rope_theta": 100.0}, "'yarn'"), ({"type": "linear"}, "'linear'")):
        message = f"^TriAttention supports the default RoPE only; this model uses rope_type {rope_type}$"
        with pytest.raises(KvbenchError, match=message):
            rope_layout(_model(_Config(rope_parameters=params)), 8)
    with pytest.raises(KvbenchError, match=r"^the model config has no rope_theta; TriAttention cannot place its "):
        rope_layout(_model(_Config(rope_parameters={"rope_type": "default"})), 8)


def test_rope_layout_refuses_applied_frequencies_it_cannot_use():
    """A rotary embedding whose inv_freq disagrees with the config (shape, or values beyond 1 %), or that scales
    attention, is refused by name; within 1 % it is accepted (the config's frequencies here: [1.0, 0.1])."""
    from kvbench.methods.triattention import rope_layout

    config = _Config(rope_theta=100.0, partial_rotary_factor=0.5)
    mismatch = (
        r"^FakeRotaryEmbedding\.inv_freq does not match rope_theta=100\.0, partial_rotary_factor=0\.5, head_dim=8; "
        r"TriAttention cannot place its frequency bands$"
    )
    for applied in (
        torch.tensor([1.0, 0.1, 0.01]),  # one band too many
        torch.tensor([1.0, 0.103]),  # 3 % off
        torch.tensor([1.0, 0.5]),  # 5x off
        torch.tensor([2.5, 0.1]),  # off by more than the value itself
    ):
        with pytest.raises(KvbenchError, match=mismatch):
            rope_layout(_model(config, FakeRotaryEmbedding(applied)), 8)
    # the 1 % is relative only: at theta 1e14 the second band's frequency is 1e-7, and 5e-9 off is refused
    tiny_band = FakeRotaryEmbedding(torch.tensor([1.0, 1.05e-7]))
    with pytest.raises(KvbenchError, match=r"^FakeRotaryEmbedding\.inv_freq does not match rope_theta=1"):
        rope_layout(_model(_Config(rope_theta=1e14, partial_rotary_factor=0.5), tiny_band), 8)
    _, inv_freq, _ = rope_layout(_model(config, FakeRotaryEmbedding(torch.tensor([1.0, 0.1009]))), 8)  # 0.9 % off
    assert torch.equal(inv_freq, torch.tensor([1.0, 0.1009]).double())
    scaled = FakeRotaryEmbedding(torch.tensor([1.0, 0.1]))
    scaled.attention_scaling = 2.0
    with pytest.raises(KvbenchError, match=r"^TriAttention supports RoPE attention scaling 1 only, got 2\.0$"):
        rope_layout(_model(config, scaled), 8)
    scaled.attention_scaling = 1.0
    assert rope_layout(_model(config, scaled), 8)[0] == 4


def test_band_index_by_hand():
    assert [i.tolist() for i in band_index(8, 4)] == [[0, 1, 4, 5], [2, 3, 6, 7]]  # 2 rotated + 2 pass-through bands
    assert [i.tolist() for i in band_index(8, 8)] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # all rotated
    assert [i.tolist() for i in band_index(8, 0)] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # none rotated
    for head_dim, rotary_dim in ((8, 3), (7, 4), (8, 10)):  # odd rotary, odd pass-through, rotary > head_dim
        with pytest.raises(KvbenchError, match=rf"^cannot split head_dim {head_dim} into rotary dim {rotary_dim} and"):
            band_index(head_dim, rotary_dim)


def test_calibration_texts_need_a_tokenizer():
    with pytest.raises(KvbenchError, match=r"^calibration texts need a tokenizer$"):
        calibrate(tiny_model("qwen3_next"), None, ["some text"])


def test_geometric_offsets_edges():
    assert geometric_offsets(1) == (1,) and geometric_offsets(5) == (1, 2, 4)
    with pytest.raises(ValueError, match=r"^max_offset must be >= 1$"):
        geometric_offsets(0)


@pytest.mark.parametrize("aggregation", ["mean", "max"])
@pytest.mark.parametrize("round_start", [25, 3000])
@pytest.mark.parametrize("H", [4, 6])  # groups of 2 and of 3 query heads per KV head
def test_trig_scores_match_direct_sum(aggregation, round_start, H):
    H_kv, D, R, n = 2, 12, 4, 25  # 2 rotated bands, 4 zero-frequency bands
    stats = random_stats(1, H, D, R)
    keys = torch.randn(H_kv, n, D, generator=torch.Generator().manual_seed(1))
    offsets = geometric_offsets(65536)
    args = (stats.q_mean_re[0], stats.q_mean_im[0], stats.q_abs_mean[0])
    got = trig_scores(keys, *args, stats.omega, R, round_start=round_start, offsets=offsets, aggregation=aggregation)
    want = brute_force(keys, *args, R, round_start, offsets, aggregation)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    no_mlr = trig_scores(
        keys, *args, stats.omega, R, round_start=round_start, offsets=offsets, mlr=False, aggregation=aggregation
    )
    torch.testing.assert_close(
        no_mlr.double(), brute_force(keys, *args, R, round_start, offsets, aggregation, False), rtol=1e-4, atol=1e-4
    )


def test_zero_frequency_bands_are_position_independent():
    """A key living only in the pass-through dims scores its plain dot product with the centre, whatever
    its position; a rotated-only key does not."""
    H, D, R, n = 1, 8, 4, 6
    stats = random_stats(1, H, D, R, seed=2)
    key = torch.randn(D, generator=torch.Generator().manual_seed(3))
    key[:R] = 0
    keys = key.expand(1, n, D).clone()
    s = trig_scores(
        keys, stats.q_mean_re[0], stats.q_mean_im[0], stats.q_abs_mean[0], stats.omega, R, round_start=n, mlr=False
    )
    centre = torch.zeros(D)
    for b, (re, im) in enumerate(pairs(D, R)):
        centre[re], centre[im] = stats.q_mean_re[0, 0, b], stats.q_mean_im[0, 0, b]
    torch.testing.assert_close(s[0], (centre @ key).expand(n), rtol=1e-5, atol=1e-5)
    keys = torch.randn(1, n, D, generator=torch.Generator().manual_seed(4))
    keys[..., R:] = 0
    s = trig_scores(
        keys, stats.q_mean_re[0], stats.q_mean_im[0], stats.q_abs_mean[0], stats.omega, R, round_start=n, mlr=False
    )
    assert float(s.std()) > 1e-3


@pytest.mark.parametrize("aggregation", ["mean", "max"])
def test_without_zero_frequency_bands_only_the_rotated_dims_score(aggregation):
    """zero_freq_bands=False equals the direct sum on keys whose pass-through dims are zeroed (their trig
    and MLR terms vanish), and differs from the default when those dims carry signal."""
    H, H_kv, D, R, n = 4, 2, 12, 4, 20
    stats = random_stats(1, H, D, R, seed=8)
    keys = torch.randn(H_kv, n, D, generator=torch.Generator().manual_seed(9))
    rotated_only = keys.clone()
    rotated_only[..., R:] = 0
    args = (stats.q_mean_re[0], stats.q_mean_im[0], stats.q_abs_mean[0])
    offsets = geometric_offsets(1024)
    got = trig_scores(
        keys, *args, stats.omega, R, round_start=n, offsets=offsets, aggregation=aggregation, zero_freq_bands=False
    )
    want = brute_force(rotated_only, *args, R, n, offsets, aggregation)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    default = trig_scores(keys, *args, stats.omega, R, round_start=n, offsets=offsets, aggregation=aggregation)
    assert float((default - got).abs().max()) > 1e-2


def test_zero_freq_bands_option_through_get_method(tmp_path):
    L, H, H_kv, D, R, n, prot = 2, 4, 2, 12, 4, 30, 3
    stats = random_stats(L, H, D, R, seed=10)
    g = torch.Generator().manual_seed(11)
    keys = [torch.randn(H_kv, n, D, generator=g) for _ in range(L)]
    zeroed = [k.clone() for k in keys]
    for k in zeroed:
        k[..., R:] = 0
    method = get_method("triattention", options={"zero_freq_bands": "false"})
    assert method.label == "triattention[zero_freq_bands=false]"
    assert method.method_options() == {"zero_freq_bands": False}
    method.stats = stats
    got = method.score(FakeParent(keys, n_heads=H, prot=prot))
    default = get_method("triattention")
    default.stats = stats
    want = default.score(FakeParent(zeroed, n_heads=H, prot=prot))  # the paper's setting on rotated-only keys
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert TriAttention.zero_freq_bands is True  # the default stays the paper's setting


def test_instance_settings_reach_the_trig_scores():
    # aggregation, offsets and mlr set on an instance are what head_scores passes on (not trig_scores' defaults)
    L, H, H_kv, D, R, n = 1, 2, 1, 12, 4, 20
    stats = random_stats(L, H, D, R, seed=12)
    keys = [torch.randn(H_kv, n, D, generator=torch.Generator().manual_seed(13))]
    parent = FakeParent(keys, n_heads=H)
    method = TriAttention(stats=stats)
    method.aggregation, method.offsets, method.mlr = "max", (1, 8), False
    got = method.head_scores(parent, stats, 0)
    args = (keys[0], stats.q_mean_re[0], stats.q_mean_im[0], stats.q_abs_mean[0], stats.omega, R)
    want = trig_scores(*args, round_start=n, offsets=(1, 8), aggregation="max", mlr=False)
    torch.testing.assert_close(got, want)
    for changed in ({"aggregation": "mean"}, {"offsets": geometric_offsets()}, {"mlr": True}):
        other = trig_scores(*args, round_start=n, **{"offsets": (1, 8), "aggregation": "max", "mlr": False, **changed})
        assert float((other - got).abs().max()) > 1e-3, changed  # each setting matters on these inputs


def test_trig_scores_refuses_an_unknown_aggregation():
    stats = random_stats(1, 1, 12, 4)
    with pytest.raises(ValueError, match=r"^aggregation must be 'mean' or 'max', got 'median'$"):
        trig_scores(torch.randn(1, 3, 12), stats.q_mean_re[0], stats.q_mean_im[0], stats.q_abs_mean[0], stats.omega, 4,
                    round_start=3, aggregation="median")  # fmt: skip


def test_zscore_uses_the_body_unless_fewer_than_two_entries():
    scores = torch.tensor([[9.0, 1.0, 3.0], [0.0, 2.0, 6.0]])
    body = scores[:, 1:]  # two body entries: standardised by the body's mean and population std
    want = (scores - body.mean(1, keepdim=True)) / body.std(1, unbiased=False, keepdim=True)
    torch.testing.assert_close(zscore(scores, 1), want)
    whole = (scores - scores.mean(1, keepdim=True)) / scores.std(1, unbiased=False, keepdim=True)
    torch.testing.assert_close(zscore(scores, 2), whole)  # one body entry: the whole row
    torch.testing.assert_close(zscore(scores, 3), whole)  # none


def test_seed_default_and_shape_and_fingerprint_errors_name_the_statistics(tmp_path):
    assert TriAttention().seed == 0 and TriAttention(seed=4).seed == 4
    L, H, D, R = 2, 4, 12, 4
    parent = FakeParent([torch.randn(2, 10, D)] * L, n_heads=H)
    wrong = random_stats(L, 2, D, R)  # 2 heads, the model 4
    with pytest.raises(
        KvbenchError,
        match=r"^TriAttention statistics \(in memory\) have \[layers, heads, bands\] "
        r"\[2, 2, 6\] and head_dim 12, the model \[2, 4, 6\] and 12; recalibrate with `kvbench",
    ):
        TriAttention(stats=wrong).score(parent)
    path = wrong.save_stats(tmp_path / "wrong.safetensors")
    with pytest.raises(KvbenchError, match=r"^TriAttention statistics .*wrong\.safetensors have \[layers"):
        TriAttention(stats_path=path).score(parent)
    other = random_stats(L, H, D, R, fingerprint="b" * 64)
    with pytest.raises(
        KvbenchError,
        match=r"^the TriAttention statistics given in memory was made for model "
        r"fingerprint bbbbbbbbbbbbbbbb…",
    ):
        TriAttention(stats=other, fingerprint="c" * 64).load()


def test_method_zscores_and_takes_group_max(tmp_path):
    L, H, H_kv, D, R, n, prot = 2, 4, 2, 12, 4, 30, 3
    stats = random_stats(L, H, D, R, seed=5)
    path = stats.save_stats(tmp_path / "stats.safetensors")
    g = torch.Generator().manual_seed(6)
    parent = FakeParent([torch.randn(H_kv, n, D, generator=g) for _ in range(L)], n_heads=H, prot=prot)
    method = TriAttention(stats_path=path)
    got = method.score(parent)
    for f in range(L):
        raw = brute_force(
            parent.keys(f), stats.q_mean_re[f], stats.q_mean_im[f], stats.q_abs_mean[f], R, n, geometric_offsets(65536)
        )
        body = raw[:, prot:]
        z = (raw - body.mean(1, keepdim=True)) / body.std(1, unbiased=False, keepdim=True)
        want = torch.stack([torch.maximum(z[2 * k], z[2 * k + 1]) for k in range(H_kv)])
        torch.testing.assert_close(got[f].double(), want, rtol=1e-4, atol=1e-4)
    # the same statistics in memory give the same scores; a known, different fingerprint is refused
    in_memory = TriAttention(stats=stats).score(parent)
    assert all(torch.equal(a, b) for a, b in zip(in_memory, got, strict=True))
    with pytest.raises(KvbenchError, match="kvbench calibrate triattention"):
        TriAttention(stats=stats, fingerprint="0" * 64).score(parent)


def test_artifact_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path))
    parent = FakeParent([torch.randn(2, 10, 12)], n_heads=4)
    with pytest.raises(KvbenchError, match="kvbench calibrate triattention"):
        TriAttention(fingerprint="a" * 64).score(parent)  # no artifact at the default path
    with pytest.raises(KvbenchError, match="kvbench calibrate triattention"):
        TriAttention().score(parent)  # nothing to locate it with
    with pytest.raises(KvbenchError, match=r"^TriAttention cannot locate its calibration statistics: `stats_path`"):
        TriAttention().score(parent)
    stats = random_stats(1, 4, 12, 4, fingerprint="b" * 64)
    stats.save_stats(default_stats_path("b" * 64))
    assert default_stats_path("b" * 64) == tmp_path / "calibration" / "triattention" / ("b" * 16 + ".safetensors")
    TriAttention(fingerprint="b" * 64).score(parent)  # found at the default path
    with pytest.raises(KvbenchError, match="heads"):
        TriAttention(fingerprint="b" * 64).score(FakeParent([torch.randn(2, 10, 12)], n_heads=2))
    bad = tmp_path / "junk.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(KvbenchError, match="kvbench calibrate triattention"):
        load_stats(bad, None)


def test_prepare_offline_passes_the_seed_and_calibrates_in_memory(tmp_path):
    model, tok = tiny_model("qwen3_next"), byte_tokenizer()
    method = TriAttention.prepare_offline(model, tok, tmp_path, seed=5)
    assert method.seed == 5 and TriAttention.prepare_offline(model, tok, tmp_path).seed == 0
    assert not any(tmp_path.iterdir())  # nothing written


def test_load_stats_errors_name_the_artifact_and_the_digest_is_the_files(tmp_path):
    import hashlib

    from safetensors.torch import save_file

    from kvbench.artifacts import META_KEY

    path = random_stats(1, 2, 8, 4, fingerprint="c" * 64).save_stats(tmp_path / "s.safetensors")
    stats = load_stats(path, "c" * 64)
    assert stats.file_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(KvbenchError, match=r"^no TriAttention calibration statistics at "):
        load_stats(tmp_path / "absent.safetensors", None)
    with pytest.raises(KvbenchError, match=r"^the TriAttention calibration statistics at .*s\.safetensors was made"):
        load_stats(path, "d" * 64)
    meta = {"format": json.loads(path.with_suffix(".json").read_text())["format"]}  # no fingerprint at all
    bare = tmp_path / "bare.safetensors"
    tensors = {n: getattr(stats, n) for n in ("q_mean_re", "q_mean_im", "q_abs_mean", "omega")}
    save_file(tensors, bare, metadata={META_KEY: json.dumps(meta)})
    with pytest.raises(KvbenchError, match="made for model fingerprint …, but this model"):
        load_stats(bare, "c" * 64)
    odd = tmp_path / "odd.safetensors"
    save_file({"omega": stats.omega}, odd, metadata={META_KEY: json.dumps({**meta, "fingerprint": "c" * 64})})
    expected = r"\['q_mean_re', 'q_mean_im', 'q_abs_mean', 'omega'\]"
    with pytest.raises(KvbenchError, match=rf"holds tensors \['omega'\], expected {expected}; recreate it with"):
        load_stats(odd, None)


def _queries_unrotated_by_hf(model, engine, ids):
    """Prefill, then undo RoPE with the model's own rotary embedding and rotate_half: [L, H, n, D]."""
    from transformers.models.qwen3_next.modeling_qwen3_next import rotate_half

    parent = engine.prefill(ids, prot=0, query_window=len(ids))
    try:
        x = torch.zeros(1, len(ids), engine.head_dim)
        cos, sin = model.model.rotary_emb(x, torch.arange(len(ids))[None])  # [1, n, R]
        R = cos.shape[-1]
        out = []
        for f in range(parent.n_attn_layers):
            q = parent.queries(f, range(len(ids))).double()
            rot = q[..., :R]
            unrot = rot * cos[0].double() - rotate_half(rot) * sin[0].double()  # inverse rotation
            out.append(torch.cat([unrot, q[..., R:]], dim=-1))
        return torch.stack(out), R
    finally:
        parent.release()


def test_calibrate_on_tiny_model_round_trip_and_fingerprint(tmp_path, monkeypatch):
    from kvbench.engines.torch_engine import TorchEngine
    from kvbench.models import byte_tokenizer, fingerprint

    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path))
    model, tok = tiny_model("qwen3_next"), byte_tokenizer()
    g = torch.Generator().manual_seed(7)
    docs = [torch.randint(0, 256, (40,), generator=g).tolist(), torch.randint(0, 256, (30,), generator=g).tolist()]
    fp = fingerprint(model, tok)
    stats = calibrate(model, tok, docs, max_tokens=60)
    assert stats.fingerprint == fp
    assert (stats.metadata["n_tokens"], stats.metadata["n_documents"], stats.rotary_dim) == (60, 2, 16)
    assert stats.q_mean_re.shape == (3, 4, 32)

    # independent statistics: HF's own inverse rotation, bands paired explicitly
    engine = TorchEngine(model, tok)
    q1, R = _queries_unrotated_by_hf(model, engine, docs[0])
    q2, _ = _queries_unrotated_by_hf(model, engine, docs[1][:20])
    q = torch.cat([q1, q2], dim=2)  # [L, H, 60, D]
    bands = pairs(64, R)
    re = torch.stack([q[..., a] for a, _ in bands], dim=-1)
    im = torch.stack([q[..., b] for _, b in bands], dim=-1)
    torch.testing.assert_close(stats.q_mean_re.double(), re.mean(2), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(stats.q_mean_im.double(), im.mean(2), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(stats.q_abs_mean.double(), torch.hypot(re, im).mean(2), rtol=1e-4, atol=1e-5)

    # round trip through the default artifact location, json sidecar included
    path = stats.save_stats(default_stats_path(fp))
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["fingerprint"] == fp and meta["rotary_dim"] == 16
    loaded = load_stats(path, fp)
    for name in ("q_mean_re", "q_mean_im", "q_abs_mean", "omega"):
        assert torch.equal(getattr(loaded, name), getattr(stats, name))
    with pytest.raises(KvbenchError, match="kvbench calibrate triattention"):
        load_stats(path, "0" * 64)
    with pytest.raises(KvbenchError, match="kvbench calibrate triattention"):
        TriAttention(stats_path=path, fingerprint="0" * 64).load()

    # the calibrated centre, rotated by HF to future positions, scores the real cached keys as trig_scores
    ids = torch.randint(0, 256, (50,), generator=g).tolist()
    parent = engine.prefill(ids, prot=2, query_window=0)
    try:
        method = get_method("triattention")
        method.fingerprint = fp
        scores = method.score(parent)
        assert [s.shape for s in scores] == [(2, 50)] * 3
        assert all(bool(torch.isfinite(s).all()) for s in scores)
        # without `fingerprint`, it is the parent's (the engine's model and tokenizer)
        assert parent.model_fingerprint == fp
        derived = get_method("triattention")
        assert derived.resolve_stats_path(parent) == path
        for a, b in zip(derived.score(parent), scores, strict=True):
            assert torch.equal(a, b)

        from transformers.models.qwen3_next.modeling_qwen3_next import apply_rotary_pos_emb

        f, h = 1, 3
        centre = torch.zeros(64, dtype=torch.float64)
        for b, (a, c) in enumerate(bands):
            centre[a], centre[c] = stats.q_mean_re[f, h, b], stats.q_mean_im[f, h, b]
        offsets = geometric_offsets(1024)
        pos = torch.tensor([[50 + o for o in offsets]])
        cos, sin = model.model.rotary_emb(torch.zeros(1, len(offsets), 64, dtype=torch.float64), pos)
        rotated, _ = apply_rotary_pos_emb(
            centre.expand(1, 1, len(offsets), 64), centre.expand(1, 1, len(offsets), 64), cos.double(), sin.double()
        )
        want = (rotated[0, 0] @ parent.keys(f)[h // 2].double().T).mean(0)  # [50]
        got = trig_scores(
            parent.keys(f),
            stats.q_mean_re[f],
            stats.q_mean_im[f],
            stats.q_abs_mean[f],
            stats.omega,
            16,
            round_start=50,
            offsets=offsets,
            mlr=False,
        )[h]
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3)
    finally:
        parent.release()


def test_round_robin_interleaves_corpus_kinds():
    from kvbench.corpus import Document, round_robin

    docs = [Document(c, f"{c}{i}", "x") for c, k in (("a", 3), ("b", 1), ("c", 2)) for i in range(k)]
    assert [d.doc_id for d in round_robin(docs)] == ["a0", "b0", "c0", "a1", "c1", "a2"]
    assert round_robin([]) == []


def test_calibrate_command_uses_every_kind_within_the_trained_length(tmp_path, monkeypatch, capsys):
    """`kvbench calibrate` on two kinds with a budget of two documents uses the first of each kind (not the
    first kind's two), each cut to the model's trained context_length."""
    from kvbench import cli
    from kvbench.models import load_model

    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    texts = {}
    for kind in ("a-kind", "b-kind"):
        (tmp_path / "corpus" / kind).mkdir(parents=True)
        for i in range(2):
            texts[kind, i] = " ".join(f"{kind}{i}w{j}" for j in range(40))  # over 40 byte tokens
            (tmp_path / "corpus" / kind / f"{i}.txt").write_text(texts[kind, i])
    lm = load_model("tiny-random")
    lm.context_length = 40  # as a model whose kvbench_builtin.json states a trained length of 40
    monkeypatch.setattr("kvbench.models.load_model", lambda *a, **k: lm)
    out = tmp_path / "stats.safetensors"
    args = ["calibrate", "triattention", "--corpus", str(tmp_path / "corpus"), "--max-tokens", "80"]
    monkeypatch.setattr("sys.argv", ["kvbench", *args, "--out", str(out)])
    cli.main()  # returns on success (exit 2 would raise SystemExit)
    got = load_stats(out, lm.fingerprint)
    assert (got.metadata["n_documents"], got.metadata["n_tokens"], got.metadata["max_len"]) == (2, 80, 40)
    err = capsys.readouterr().err.replace("\n", "")
    assert f"calibrated triattention for tiny-random -> {out}: 2 documents, 80 tokens (each cut to 40)" in err
    want = calibrate(lm.model, lm.tokenizer, [texts["a-kind", 0], texts["b-kind", 0]], max_tokens=80, max_len=40)
    assert torch.equal(got.q_mean_re, want.q_mean_re) and torch.equal(got.q_abs_mean, want.q_abs_mean)
