"""GateSight units: Eq. 2 against brute-force deletion, the label checks, window features, the batched
estimator, training determinism, metrics, sampling, corpora, the artifact and the method's errors."""

from __future__ import annotations

import hashlib
import json
import math
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from kvbench.corpus import read_corpus
from kvbench.engines.torch_engine import TorchEngine, TorchParent
from kvbench.errors import KvbenchError
from kvbench.methods import get_method
from kvbench.methods.gatesight import estimator as estimator_mod
from kvbench.methods.gatesight.estimator import (
    ARTIFACT_ENV,
    PRODUCE_COMMAND,
    WEIGHTS_FILE,
    GateSightEstimator,
    default_artifact_dir,
    load_artifact,
    save_artifact,
)
from kvbench.methods.gatesight.evaluate import k_for, metrics_for_head, spearman, top_k
from kvbench.methods.gatesight.features import AGE_NAMES, age_features, feature_dims, layer_features, window_ordinals
from kvbench.methods.gatesight.labels import load_labels
from kvbench.methods.gatesight.method import GateSight
from kvbench.methods.gatesight.train import (
    TrainConfig,
    TrainingData,
    _clip_per_mlp,
    fit_ridge,
    fit_ridge_chunks,
    fit_ridge_layer,
    normalised_utility,
    train_estimator,
)
from kvbench.methods.gatesight.utility import (
    LabelCheckError,
    LabelConfig,
    label_document,
    sample_continuations,
    sample_next,
)
from kvbench.methods.kv_utility import (
    delta_r_brute_force,
    delta_r_closed_form,
    head_output_weights,
    recompute_attention,
)
from kvbench.models import build_random, byte_tokenizer, fingerprint, tiny_qwen3_next_config
from tests.conftest import tiny_model

TINY_ATTN = [3, 7, 11]


pytestmark = pytest.mark.usefixtures("one_thread")
TINY_GDN = [0, 1, 2, 4, 5, 6, 8, 9, 10]


# ----------------------------------------------------------------------------------------------------
# Eq. 2
# ----------------------------------------------------------------------------------------------------


def test_closed_form_matches_deletion_on_random_tensors():
    """G = 3 query heads per KV head, a prefix longer than the rows, hidden != D: every (row, entry)."""
    torch.manual_seed(0)
    H_kv, G, D, hidden, n, T = 2, 3, 8, 20, 11, 5
    q = torch.randn(H_kv * G, T, D)
    k = torch.randn(H_kv, n + T, D)
    v = torch.randn(H_kv, n + T, D)
    w = head_output_weights(torch.randn(hidden, H_kv * G * D), H_kv * G)
    a, o = recompute_attention(q, k, v, 0.5)
    cf = delta_r_closed_form(a, o, v, w, n, chunk=2)
    bf = delta_r_brute_force(q, k, v, w, 0.5, range(n))
    assert cf.shape == (H_kv, T, n)
    assert (cf.double() - bf).abs().max() <= 1.4e-5 * bf.max()
    # a direct float64 evaluation of Eq. 2 for one (row, entry) as a third opinion
    a64, o64 = recompute_attention(q, k, v, 0.5, torch.float64)
    h, t, i = 1, 3, 4
    vec = sum(
        a64[h, j, t, i] / (1 - a64[h, j, t, i]) * (w[h * G + j].double() @ (v[h, i].double() - o64[h, j, t]))
        for j in range(G)
    )
    assert torch.isclose(vec.norm(), bf[h, t, i], rtol=1e-10)
    # the causal mask matters: row 0 cannot see the later continuation keys
    assert a[:, :, 0, n + 1 :].abs().max() == 0


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_closed_form_matches_deletion_on_tiny_model(family):
    """Every attention layer, KV head, continuation row and context entry of a short document."""
    model = tiny_model(family)
    engine = TorchEngine(model)
    tok = byte_tokenizer()
    ctx = tok("a b c a b c d. " * 3, add_special_tokens=False)["input_ids"]
    cont = sample_continuations(model, ctx, m=1, max_new_tokens=6, seed=3)[0]
    n, T = len(ctx), len(cont)
    parent = engine.prefill(ctx + cont, 0, query_window=T)
    try:
        for f, mod in enumerate(engine.adapter.attn):
            q = parent.queries(f, range(n, n + T)).float()
            k, v = parent.keys(f).float(), parent.values(f).float()
            w = head_output_weights(mod.o_proj.weight.float(), engine.n_heads)
            a, o = recompute_attention(q, k, v, mod.scaling)
            cf = delta_r_closed_form(a, o, v, w, n)
            bf = delta_r_brute_force(q, k, v, w, mod.scaling, range(n))
            err = ((cf.double() - bf).abs().amax(dim=(1, 2)) / bf.amax(dim=(1, 2))).max()
            assert err <= 1.4e-5, (f, err)
    finally:
        parent.release()
    # label_document's U is the max over rows of the same quantity
    lab = label_document(engine, ctx, 0, LabelConfig(), continuations=[cont])
    assert lab.utility.shape == (3, 2, n) and lab.n == n
    assert lab.checks["closed_form_max_err"] <= 1.4e-5 and lab.checks["covered"]
    assert lab.checks["output_max_rel_err"] <= 1e-3
    assert len(lab.beta) == len(TINY_GDN) and lab.beta[0].shape == (n, 4)
    assert lab.gate_head_mean.shape == (3, 4)


def test_label_checks_fail_loudly(monkeypatch):
    engine = TorchEngine(tiny_model("qwen3_next"))
    ctx = list(range(40, 70))
    cont = [[5, 6, 7, 8]]
    with pytest.raises(LabelCheckError, match="brute-force"):
        label_document(engine, ctx, 2, LabelConfig(closed_form_tol=0.0), continuations=cont)
    with pytest.raises(LabelCheckError, match="module's"):
        label_document(engine, ctx, 2, LabelConfig(output_tol=1e-15), continuations=cont)
    # rows in the wrong order (a query bookkeeping bug) are self-consistent for Eq. 2 but do not reproduce the
    # module's output: the reconstruction check catches them
    original = TorchParent.queries
    monkeypatch.setattr(TorchParent, "queries", lambda self, f, pos: original(self, f, list(pos)[::-1]))
    with pytest.raises(LabelCheckError, match="module's"):
        label_document(engine, ctx, 2, LabelConfig(), continuations=cont)
    monkeypatch.undo()
    with pytest.raises(KvbenchError, match="empty"):
        label_document(engine, ctx, 2, LabelConfig(), continuations=[[]])


# ----------------------------------------------------------------------------------------------------
# Features
# ----------------------------------------------------------------------------------------------------


def test_window_ordinals_edges():
    assert window_ordinals(TINY_ATTN, TINY_GDN, 6) == [[0, 1, 2], [0, 1, 2, 3, 4, 5], [3, 4, 5, 6, 7, 8]]
    assert window_ordinals(TINY_ATTN, TINY_GDN, 2) == [[1, 2], [4, 5], [7, 8]]
    assert window_ordinals([0, 2], [1], 6) == [[], [0]]  # an attention layer with no GDN layer before it
    assert window_ordinals(TINY_ATTN, TINY_GDN, 0) == [[], [], []]
    assert feature_dims([[0, 1, 2], [0, 1, 2, 3, 4, 5]], 48) == [3 * 48 * 3 + 3, 867]
    with pytest.raises(ValueError, match=r"^window must be >= 0, got -1$"):
        window_ordinals(TINY_ATTN, TINY_GDN, -1)


def test_feature_names_follow_the_feature_order():
    from kvbench.methods.gatesight.features import feature_names

    names = feature_names([1, 2], [0, 1, 2, 4], 2)  # GDN ordinals 1, 2 are layers 1 and 2; two value heads
    assert len(names) == feature_dims([[1, 2]], 2)[0] == 15
    assert names[:6] == ["gdn1.h0.beta", "gdn1.h0.g", "gdn1.h0.vnorm", "gdn1.h1.beta", "gdn1.h1.g", "gdn1.h1.vnorm"]
    assert names[6] == "gdn2.h0.beta" and names[-3:] == ["age:i/n", "age:(n-i)/n", "age:log(1+n-i)/log(1+n)"]


def test_layer_features_hand_built():
    n, Hv = 4, 2
    # signal value encodes (GDN ordinal, head, position, signal) so every column is identifiable
    beta = [torch.tensor([[100 * o + 10 * m + p + 0.1 for m in range(Hv)] for p in range(n)]) for o in range(4)]
    g = [-b for b in beta]
    vnorm = [b + 0.5 for b in beta]
    windows = window_ordinals([3, 6], [0, 1, 2, 4], 6)
    assert windows == [[0, 1, 2], [0, 1, 2, 3]]
    x = layer_features(beta, g, vnorm, windows[0])
    assert x.shape == (n, 3 * Hv * 3 + 3)
    p = 2
    expected = []
    for o in (0, 1, 2):
        for m in range(Hv):
            base = 100 * o + 10 * m + p + 0.1
            expected += [base, -base, base + 0.5]
    i = p + 1
    expected += [i / n, (n - i) / n, math.log(1 + n - i) / math.log(1 + n)]
    assert torch.allclose(x[p], torch.tensor(expected), atol=1e-5)
    # positions select rows; the age still uses the full context length
    sub = layer_features(beta, g, vnorm, windows[1], n=n, positions=torch.tensor([3, 0]))
    assert sub.shape == (2, 4 * Hv * 3 + 3)
    assert torch.allclose(sub, layer_features(beta, g, vnorm, windows[1])[[3, 0]])
    assert torch.allclose(
        age_features(4)[:, 2],
        torch.tensor([math.log(4) / math.log(5), math.log(3) / math.log(5), math.log(2) / math.log(5), 0.0]),
    )
    # one GDN layer: an empty window gives the age features alone, a window of one its 3 * Hv columns first; the
    # context length comes from the signals either way
    one = [beta[0][:3]], [g[0][:3]], [vnorm[0][:3]]
    assert torch.equal(layer_features(*one, []), age_features(3))
    assert torch.equal(layer_features([], [], [], [], n=3), age_features(3))  # a model without GDN layers
    x = layer_features(*one, [0])
    assert x.shape == (3, Hv * 3 + 3) and torch.equal(x[:, -3:], age_features(3))


# ----------------------------------------------------------------------------------------------------
# Estimator and training
# ----------------------------------------------------------------------------------------------------


def test_estimator_is_per_head_mlp_and_deterministic(monkeypatch):
    windows = [[0, 1], [0, 1, 2]]
    est = GateSightEstimator(windows, n_kv_heads=3, n_value_heads=2, hidden=5)
    est.reset_parameters(torch.Generator().manual_seed(1))
    again = GateSightEstimator(windows, 3, 2, hidden=5)
    again.reset_parameters(torch.Generator().manual_seed(1))
    for a, b in zip(est.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    est.set_feature_stats(1, torch.full((21,), 0.5), torch.full((21,), 2.0))
    x = torch.randn(17, 21)
    logits = est.layer_logits(1, x)
    assert logits.shape == (3, 17)
    for h in range(3):  # a plain Linear -> ReLU -> Linear per head
        lin1 = torch.nn.Linear(21, 5)
        lin2 = torch.nn.Linear(5, 1)
        with torch.no_grad():
            lin1.weight.copy_(est.w1[1][h].T)
            lin1.bias.copy_(est.b1[1][h])
            lin2.weight.copy_(est.w2[1][h][None])
            lin2.bias.copy_(est.b2[1][h][None])
        ref = lin2(torch.relu(lin1((x - 0.5) / 2.0))).squeeze(-1)
        assert torch.allclose(logits[h], ref, atol=1e-5)
    longer = torch.randn(30, 21)  # more rows than features
    whole = est.layer_logits(1, longer)
    monkeypatch.setattr(estimator_mod, "CHUNK", 4)  # chunked rows give the same scores
    assert torch.allclose(est.layer_logits(1, x), logits)
    assert torch.allclose(est.layer_logits(1, longer), whole)
    assert est.layer_logits(1, torch.randn(0, 21)).shape == (3, 0)  # no rows: [H_kv, 0]
    beta = [torch.rand(9, 2) for _ in range(3)]
    scores = est.score_signals(beta, [-b for b in beta], [b + 1 for b in beta])
    assert [tuple(s.shape) for s in scores] == [(3, 9), (3, 9)]
    with pytest.raises(KvbenchError, match=r"^layer 1 expects 21 features, got 20$"):
        est.layer_logits(1, torch.randn(2, 20))
    # stds below 1e-6 (constant features) become 1, the others are kept
    est.set_feature_stats(0, torch.zeros(15), torch.tensor([0.0, 1e-7, 1e-6, 0.5, 2.0]).repeat(3))
    assert torch.equal(est.feature_stats(0)[1], torch.tensor([1.0, 1.0, 1e-6, 0.5, 2.0]).repeat(3))


def test_estimator_init_is_uniform_in_one_over_sqrt_fan_in():
    """``nn.Linear``'s default: every weight and bias uniform in +-1/sqrt(fan_in) (fan_in d_f for the hidden
    layer, hidden for the output), filling that range."""
    est = GateSightEstimator([[0, 1]], n_kv_heads=32, n_value_heads=2, hidden=64)
    est.reset_parameters(torch.Generator().manual_seed(0))
    for p, fan_in in ((est.w1[0], 15), (est.b1[0], 15), (est.w2[0], 64), (est.b2[0], 64)):
        p, bound = p.detach(), 1 / math.sqrt(fan_in)
        assert float(p.abs().max()) <= bound
        assert float(p.min()) < -0.5 * bound and float(p.max()) > 0.5 * bound, (tuple(p.shape), bound)


def _synthetic_data(N=300, L_gdn=3, Hv=2, L=2, H_kv=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    sig = torch.randn(N, L_gdn, Hv, 3, generator=gen)
    age = age_features(N)
    target = torch.sigmoid(3 * sig[:, :, 0, 0].sum(1, keepdim=True)).expand(N, L).unsqueeze(-1).expand(N, L, H_kv)
    return TrainingData(sig, age, target.contiguous(), torch.zeros(N, dtype=torch.long), [])


MANIFEST = {
    "fingerprint": "f" * 64,
    "model": "synthetic",
    "model_type": "qwen3_next",
    "attn_layer_ids": [2, 4],
    "gdn_layer_ids": [0, 1, 3],
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 8,
    "n_value_heads": 2,
}


def test_training_is_deterministic_and_learns():
    data = _synthetic_data()
    cfg = TrainConfig(window=6, epochs=6, batch_size=32)
    a = train_estimator(data, MANIFEST, cfg, gate_means=[0.2, 0.4])
    b = train_estimator(data, MANIFEST, cfg, gate_means=[0.2, 0.4])
    for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y)
    assert a.windows == [[0, 1], [0, 1, 2]]
    hist = a.metadata["training"]["loss_per_epoch"]
    assert len(hist) == 6 and hist[-1] < hist[0] - 0.02
    assert a.gate_means.tolist() == [0.2, 0.4]


def test_gradient_clipping_is_per_mlp():
    est = GateSightEstimator([[0], [0, 1]], n_kv_heads=2, n_value_heads=1, hidden=3)
    for p in est.parameters():
        p.grad = torch.ones_like(p)
    est.w1[0].grad[1] *= 0.01  # layer 0, head 1: a small gradient
    for p in (est.b1[0], est.w2[0], est.b2[0]):
        p.grad[1] *= 0.01
    before = est.w1[0].grad[1].clone()
    _clip_per_mlp(est, 1.0)
    for f in range(2):
        params = (est.w1[f], est.b1[f], est.w2[f], est.b2[f])
        norms = sum(p.grad.pow(2).reshape(2, -1).sum(1) for p in params).sqrt()
        assert norms.max() <= 1.0 + 1e-5
    assert torch.equal(est.w1[0].grad[1], before)  # its norm is below the clip: untouched, not rescaled jointly


def test_ridge_and_normalisation():
    x = torch.randn(200, 3, dtype=torch.float64)
    y = torch.stack([x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 3, x[:, 0]], 1)
    w, b = fit_ridge(x.float(), y.float(), alpha=1e-6)
    assert torch.allclose(w[:, 0], torch.tensor([1.0, -2.0, 0.5]), atol=1e-4) and abs(float(b[0]) - 3) < 1e-4
    w2, b2 = fit_ridge_chunks([(x[:70].float(), y[:70].float()), (x[70:].float(), y[70:].float())], alpha=1e-6)
    assert torch.allclose(w, w2, atol=1e-5) and torch.allclose(b, b2, atol=1e-5)  # streamed = in one piece
    data = _synthetic_data(N=50)
    est = GateSightEstimator([[0, 1], [0, 1, 2]], 2, 2, hidden=4)
    wl, bl = fit_ridge_layer(data, est, 1, alpha=0.5, chunk=7)
    wf, bf = fit_ridge(data.layer_features([0, 1, 2]), data.target[:, 1], alpha=0.5)
    assert torch.allclose(wl, wf, atol=1e-5) and torch.allclose(bl, bf, atol=1e-5)
    u = torch.tensor([[[9.0, 1.0, 2.0, 4.0], [5.0, 0.0, 0.0, 0.0]]])
    nu = normalised_utility(u, prot=1)  # the protected prefix is outside the normalisation
    assert torch.allclose(nu[0, 0, 1:], torch.tensor([0.25, 0.5, 1.0])) and torch.equal(nu[0, 1], torch.zeros(4))


# ----------------------------------------------------------------------------------------------------
# Metrics, sampling, corpora
# ----------------------------------------------------------------------------------------------------


def test_metrics_hand_worked():
    assert spearman(torch.tensor([1.0, 2, 3, 4]), torch.tensor([10.0, 20, 30, 40])) == pytest.approx(1.0)
    assert spearman(torch.tensor([1.0, 1, 2]), torch.tensor([1.0, 2, 3])) == pytest.approx(0.8660254)  # ties
    assert spearman(torch.ones(5), torch.arange(5.0)) == 0.0
    assert k_for(0.05, 100) == 5 and k_for(0.05, 50) == 4 and k_for(0.1, 3) == 3 and k_for(0.2, 99) == 19
    u = torch.arange(100, 0, -1).double()  # entry 0 is best
    pred = torch.zeros(100)
    pred[[0, 1, 2, 50, 60]] = 1.0  # 3 of the true top 5
    m = metrics_for_head(pred, u, torch.Generator().manual_seed(0))
    assert m["ov@5"] == pytest.approx(3 / 5)
    assert m["cov@5"] == pytest.approx((100 + 99 + 98 + 50 + 40) / (100 + 99 + 98 + 97 + 96))
    # ties are broken at random, not by position
    picks = {tuple(sorted(top_k(torch.zeros(10), 3, torch.Generator().manual_seed(s)).tolist())) for s in range(5)}
    assert len(picks) > 1


def test_sample_next_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(0)
    seen = {int(sample_next(logits, 1.0, 20, 0.7, gen)) for _ in range(200)}
    assert seen == {0, 1}  # 0.5 < 0.7 so token 1 is kept; 0.8 >= 0.7 stops before token 2
    assert {int(sample_next(logits, 1.0, 1, 1.0, gen)) for _ in range(20)} == {0}
    assert {int(sample_next(logits, 1.0, 3, 1.0, gen)) for _ in range(300)} == {0, 1, 2}
    a = sample_continuations(tiny_model("qwen3_next"), list(range(40, 60)), m=2, max_new_tokens=5, seed=7)
    b = sample_continuations(tiny_model("qwen3_next"), list(range(40, 60)), m=2, max_new_tokens=5, seed=7)
    assert a == b and len(a) == 2 and all(len(c) <= 5 for c in a)


def test_read_corpus(tmp_path):
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "one.txt").write_text("hello")
    (tmp_path / "web" / "sub").mkdir()
    (tmp_path / "web" / "sub" / "two.md").write_text("world")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "docs.jsonl").write_text(json.dumps({"text": "x = 1"}) + "\n\n" + json.dumps("y") + "\n")
    (tmp_path / "loose.txt").write_text("top level")
    docs = read_corpus(tmp_path)
    got = {(d.corpus, d.doc_id, d.text) for d in docs}
    assert got == {
        ("web", "one.txt", "hello"),
        ("web", "sub/two.md", "world"),
        ("code", "docs.jsonl:1", "x = 1"),
        ("code", "docs.jsonl:3", "y"),
        (tmp_path.name, "loose.txt", "top level"),
    }
    assert len({d.key for d in docs}) == len(docs)
    (tmp_path / "code" / "bad.jsonl").write_text(json.dumps({"title": "no text"}) + "\n")
    with pytest.raises(KvbenchError, match="no text field"):
        read_corpus(tmp_path)
    with pytest.raises(KvbenchError, match="does not exist"):
        read_corpus(tmp_path / "missing")


# ----------------------------------------------------------------------------------------------------
# Artifact and method
# ----------------------------------------------------------------------------------------------------


def _artifact_for(model, tok, windows=None, n_kv_heads=2, n_value_heads=4, **meta) -> GateSightEstimator:
    engine = TorchEngine(model, tok)
    windows = windows or window_ordinals(engine.adapter.attn_layer_ids, engine.adapter.gdn_layer_ids, 6)
    est = GateSightEstimator(windows, n_kv_heads, n_value_heads, hidden=8)
    est.reset_parameters(torch.Generator().manual_seed(0))
    est.gate_means.copy_(torch.tensor([0.1, 0.6, 0.3][: len(windows)], dtype=torch.float64))
    est.metadata = {
        "fingerprint": fingerprint(model, tok),
        "attn_layer_ids": engine.adapter.attn_layer_ids,
        "gdn_layer_ids": engine.adapter.gdn_layer_ids,
        "window": 6,
        **meta,
    }
    return est


def test_constructor_sets_seed_artifact_and_fingerprint():
    method = get_method("gatesight")
    assert (method.seed, method.fingerprint) == (0, None)
    cls = type(method)
    method = cls(seed=3, artifact="/some/dir", fingerprint="ab" * 32)
    assert (method.seed, str(method.artifact), method.fingerprint) == (3, "/some/dir", "ab" * 32)
    assert cls().seed == 0  # the base class's default seed


def test_method_without_artifact_or_fingerprint_names_the_lookup(monkeypatch):
    """No ``artifact``, no $KVBENCH_GATESIGHT_ARTIFACT and no known fingerprint: nowhere to look, said as such."""
    monkeypatch.delenv(ARTIFACT_ENV, raising=False)
    expected = (
        "GateSight cannot locate its artifact: no `artifact` is set, $KVBENCH_GATESIGHT_ARTIFACT is unset and the "
        f"model fingerprint is unknown (set `fingerprint` on the method); produce one with `{PRODUCE_COMMAND}`"
    )
    with pytest.raises(KvbenchError, match=f"^{re.escape(expected)}$"):
        GateSight().resolve_artifact()


def test_prepare_offline_trains_a_small_artifact_for_the_model(tmp_path):
    """Two short documents labelled under ``labels/``, one epoch of training saved as ``artifact``: an instance
    with the given seed, bound to the model's fingerprint, reading that artifact."""
    model, tok = tiny_model("qwen3_next"), byte_tokenizer()
    fp = fingerprint(model, tok)
    method = GateSight.prepare_offline(model, tok, tmp_path, seed=5)
    assert (method.seed, method.resolve_artifact(), method.model_fingerprint()) == (5, tmp_path / "artifact", fp)
    assert len(load_labels(tmp_path / "labels").docs) == 2
    training = load_artifact(tmp_path / "artifact", fp).metadata["training"]
    assert training["n_documents"] == 2
    assert training["config"]["epochs"] == 1 and len(training["loss_per_epoch"]) == 1
    assert GateSight.prepare_offline(model, tok, tmp_path).seed == 0  # the default seed (the labels are reused)


def test_saved_artifact_records_the_estimator(tmp_path):
    """gatesight.json (the weights file's "kvbench" metadata too) records the estimator's shape, architecture,
    feature layout and gate means; ``window`` is the training window when recorded, else the longest window."""
    est = GateSightEstimator([[0, 1], [0, 1, 2]], 3, 2, hidden=5, metadata={"fingerprint": "ab" * 32})
    est.gate_means.copy_(torch.tensor([0.1, 0.3], dtype=torch.float64))
    path = save_artifact(est, tmp_path / "a")
    meta = json.loads((path / "gatesight.json").read_text())
    assert (meta["window"], meta["windows"], meta["in_dims"]) == (3, [[0, 1], [0, 1, 2]], [15, 21])
    assert (meta["n_kv_heads"], meta["n_value_heads"], meta["hidden"]) == (3, 2, 5)
    assert (meta["activation"], meta["output"], meta["gate_means"]) == ("relu", "sigmoid", [0.1, 0.3])
    # the layout of features.layer_features, age features in its order
    assert meta["feature_order"] == (
        f"per window GDN layer (ascending), per value head, (beta, g, |v|); then {', '.join(AGE_NAMES)} with "
        "i = position + 1"
    )
    assert load_artifact(path).metadata == meta == est.metadata  # the saved estimator carries its artifact's json
    assert load_artifact(path).gate_means.dtype == torch.float64
    # the first attention layers have fewer GDN layers before them than the training window: the recorded one wins
    est.metadata["window"] = 6
    assert json.loads((save_artifact(est, tmp_path / "b") / "gatesight.json").read_text())["window"] == 6
    # the weights file (whose digest rows record) depends on what the estimator holds, not on the order its
    # metadata was assembled in
    reordered = GateSightEstimator(est.windows, 3, 2, hidden=5, metadata=dict(reversed(est.metadata.items())))
    reordered.load_state_dict(est.state_dict())
    again = save_artifact(reordered, tmp_path / "c")
    assert (again / WEIGHTS_FILE).read_bytes() == (tmp_path / "b" / WEIGHTS_FILE).read_bytes()


def test_artifact_round_trip_and_method(tmp_path, monkeypatch):
    model, tok = tiny_model("qwen3_next"), byte_tokenizer()
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(ARTIFACT_ENV, raising=False)
    est = _artifact_for(model, tok)
    fp = est.fingerprint
    path = save_artifact(est, default_artifact_dir(fp))
    # the documented place, the layout the shipped artifacts mirror under kvbench/builtin/calibration/
    assert default_artifact_dir(fp) == tmp_path / "cache" / "calibration" / "gatesight" / fp[:16]
    assert (path / "estimator.safetensors").is_file()
    assert json.loads((path / "gatesight.json").read_text())["window"] == 6
    back = load_artifact(path, fp)
    for a, b in zip(est.state_dict().values(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    weights_only = load_artifact(path / WEIGHTS_FILE, fp)  # the weights file itself is read as well
    assert weights_only.sha256 == back.sha256 and weights_only.metadata == back.metadata
    engine = TorchEngine(model, tok)
    parent = engine.prefill(list(range(40, 100)), prot=4)
    try:
        method = get_method("gatesight")
        assert method.default_allocation == "gate"
        scores = method.score(parent)  # found by fingerprint under $KVBENCH_CACHE
        assert [tuple(s.shape) for s in scores] == [(2, 60)] * 3
        assert method.resolve_artifact(parent) == path
        digest = hashlib.sha256((path / WEIGHTS_FILE).read_bytes()).hexdigest()
        assert method.artifact_sha256(fp) == digest == back.sha256
        assert type(method)(fingerprint=fp).artifact_sha256(None) == digest  # its own fingerprint finds it too
        s = parent.signals()
        ref = back.score_signals(s.beta, s.g, s.vnorm, parent.n)
        assert all(torch.allclose(a, b) for a, b in zip(scores, ref, strict=True))
        assert method.gate_means(parent) == pytest.approx([0.1, 0.6, 0.3])
        kept = method.select(parent, scores, 0.5, "gate")
        counts = [len(kept[f][0]) - parent.prot for f in range(3)]
        assert sum(counts) == 3 * 28 and counts[1] > counts[2] > counts[0]  # proportional to the artifact's means
        child = parent.fork(kept)
        child.answer([1, 2, 3], max_new_tokens=2, context_sha256=parent.sha256)
        child.release()
    finally:
        parent.release()


def test_artifact_errors(tmp_path, monkeypatch):
    model, tok = tiny_model("qwen3_next"), byte_tokenizer()
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(ARTIFACT_ENV, raising=False)
    engine = TorchEngine(model, tok)
    parent = engine.prefill(list(range(40, 80)), prot=2)
    try:
        with pytest.raises(KvbenchError, match="kvbench gatesight label .* && kvbench gatesight train"):
            get_method("gatesight").score(parent)  # absent
        other = _artifact_for(model, tok, fingerprint="0" * 64)
        save_artifact(other, tmp_path / "other")
        monkeypatch.setenv(ARTIFACT_ENV, str(tmp_path / "other"))
        foreign = (
            f"the GateSight artifact at {tmp_path / 'other'} was made for model fingerprint 0000000000000000…, but "
            f"this model has fingerprint {fingerprint(model, tok)[:16]}…; make one for this model with "
            f"`{PRODUCE_COMMAND}`"
        )
        with pytest.raises(KvbenchError, match=f"^{re.escape(foreign)}$"):
            get_method("gatesight").score(parent)  # another model's artifact
        wrong_heads = _artifact_for(model, tok, n_kv_heads=4)
        save_artifact(wrong_heads, tmp_path / "heads")
        method = get_method("gatesight")
        method.artifact = tmp_path / "heads"  # the explicit attribute wins over the env var
        with pytest.raises(KvbenchError, match="4 KV heads"):
            method.score(parent)
        wrong_layers = _artifact_for(model, tok, attn_layer_ids=[3, 7, 12])
        save_artifact(wrong_layers, tmp_path / "layers")
        with pytest.raises(KvbenchError, match="attention layers"):
            get_method("gatesight", seed=0).__class__(artifact=tmp_path / "layers").gate_means(parent)
        (tmp_path / "junk").mkdir()
        (tmp_path / "junk" / "estimator.safetensors").write_bytes(b"not a safetensors file")
        junk = re.escape(f"{tmp_path / 'junk' / WEIGHTS_FILE} is not a readable GateSight artifact (")
        with pytest.raises(KvbenchError, match=f"^{junk}.*{re.escape(f'); recreate it with `{PRODUCE_COMMAND}`')}$"):
            load_artifact(tmp_path / "junk")
        # a weights file without a tensor its json promises
        bad = save_artifact(_artifact_for(model, tok), tmp_path / "bad") / WEIGHTS_FILE
        with safe_open(str(bad), framework="pt") as fh:
            header = fh.metadata()
        tensors = load_file(str(bad))
        del tensors["layer2.b2"]
        save_file(tensors, str(bad), metadata=header)
        inconsistent = f"{bad} is inconsistent (KeyError: 'layer2.b2'); recreate it with `{PRODUCE_COMMAND}`"
        with pytest.raises(KvbenchError, match=f"^{re.escape(inconsistent)}$"):
            load_artifact(tmp_path / "bad")
    finally:
        parent.release()
    # the Qwen3.5 tiny model has another fingerprint: the Qwen3-Next artifact is refused
    other_model = tiny_model("qwen3_5")
    parent = TorchEngine(other_model, tok).prefill(list(range(40, 80)), prot=2)
    try:
        monkeypatch.setenv(ARTIFACT_ENV, str(tmp_path / "heads"))
        with pytest.raises(KvbenchError, match="made for model fingerprint"):
            get_method("gatesight").score(parent)
    finally:
        parent.release()


def test_method_names_every_way_an_artifact_does_not_fit(tmp_path, monkeypatch):
    """One error naming the artifact's path lists each mismatch with the model's value; an artifact that records
    no layer ids is checked on its shapes alone."""
    model, tok = tiny_model("qwen3_next"), byte_tokenizer()
    monkeypatch.delenv(ARTIFACT_ENV, raising=False)
    fits = window_ordinals(TINY_ATTN, TINY_GDN, 6)
    cases = {
        "layers": (
            _artifact_for(model, tok, windows=fits[:2], attn_layer_ids=[3, 7]),
            "2 attention layers (model: 3); attention layers [3, 7] (model: [3, 7, 11])",
        ),
        "gdn": (  # one more GDN layer after the last attention layer
            _artifact_for(model, tok, gdn_layer_ids=[*TINY_GDN, 12]),
            "GDN layers [0, 1, 2, 4, 5, 6, 8, 9, 10, 12] (model: [0, 1, 2, 4, 5, 6, 8, 9, 10])",
        ),
        "value-heads": (_artifact_for(model, tok, n_value_heads=2), "2 GDN value heads (model: 4)"),
        "windows": (  # GDN ordinal 9 of a model with 9 GDN layers
            _artifact_for(model, tok, windows=[*fits[:2], [4, 5, 6, 7, 8, 9]]),
            "windows reading GDN layers the model does not have",
        ),
    }
    parent = TorchEngine(model, tok).prefill(list(range(40, 80)), prot=2)
    try:
        for name, (est, problems) in cases.items():
            path = save_artifact(est, tmp_path / name)
            expected = (
                f"the GateSight artifact at {path} does not fit this model: it has {problems}; train one for this "
                f"model with `{PRODUCE_COMMAND}`"
            )
            with pytest.raises(KvbenchError, match=f"^{re.escape(expected)}$"):
                GateSight(artifact=path).load(parent)
        unrecorded = _artifact_for(model, tok)
        del unrecorded.metadata["attn_layer_ids"], unrecorded.metadata["gdn_layer_ids"]
        method = GateSight(artifact=save_artifact(unrecorded, tmp_path / "unrecorded"))
        assert [tuple(s.shape) for s in method.score(parent)] == [(2, 40)] * 3
    finally:
        parent.release()


def test_method_scores_the_smallest_hybrid(tmp_path):
    """One GDN layer, then one attention layer reading it: one layer of scores, the artifact's."""
    tok = byte_tokenizer()
    config = tiny_qwen3_next_config(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
    model = build_random(config)
    est = _artifact_for(model, tok)
    assert est.windows == [[0]]
    path = save_artifact(est, tmp_path / "artifact")
    parent = TorchEngine(model, tok).prefill(list(range(40, 70)), prot=2)
    try:
        scores = GateSight(artifact=path).score(parent)
        s = parent.signals()
        assert len(scores) == 1 and scores[0].shape == (2, 30)
        assert torch.allclose(scores[0], est.score_signals(s.beta, s.g, s.vnorm)[0])
    finally:
        parent.release()
