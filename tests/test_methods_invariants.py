"""One invariant suite over every registered method, both model families and every allocation the method
supports: exact budgets, protected prefix kept, sorted unique indices, determinism under a seed, and
keep-all (p = 1.0) children answering token-identically to the parent.

Methods that need an offline artifact get it from a preparer below, built on the same tiny model; a
registered method without the artifact it needs fails here rather than being skipped.
"""

from __future__ import annotations

import pytest
import torch

from kvbench import budgets
from kvbench.engines.torch_engine import TorchEngine
from kvbench.methods import QuestionInput, get_method, list_methods
from kvbench.models import byte_tokenizer
from tests.conftest import tiny_model

N, PROT = 240, 12
FAMILIES = ("qwen3_next", "qwen3_5")
BUILTIN = [m for m in list_methods() if not m.startswith("test-")]
_PREPARED: dict = {}


def _prepare(name: str, family: str, model, tok):
    """Offline artifacts some methods need, produced by their own calibration code on the tiny model."""
    key = (name, family)
    if key in _PREPARED:
        return _PREPARED[key]
    method = get_method(name, seed=3)
    if name == "triattention":
        from kvbench.methods import triattention

        texts = ["".join(chr(97 + (i * 7 + j) % 26) for j in range(300)) for i in range(2)]
        method = triattention.TriAttention(stats=triattention.calibrate(model, tok, texts))
    elif name == "gatesight":
        from tests.test_gatesight import trained_method  # the GateSight suite trains a tiny estimator

        method = trained_method(model, tok)
    _PREPARED[key] = method
    return method


def _score(method, parent):
    """``score``, or for a query-aware method ``score_question`` of one fixed question."""
    if method.query_aware:
        return method.score_question(parent, QuestionInput((11, 12, 13, 14), 6))
    return method.score(parent)


def _fresh(name, family, model, tok):
    """A new instance with the prepared artifact (for the determinism check)."""
    prepared = _prepare(name, family, model, tok)
    clone = type(prepared).__new__(type(prepared))
    clone.__dict__.update(prepared.__dict__)
    return clone


@pytest.fixture(scope="module", params=FAMILIES)
def setup(request):
    model = tiny_model(request.param)
    tok = byte_tokenizer()
    engine = TorchEngine(model, tok)
    ids = torch.randint(0, 256, (N,), generator=torch.Generator().manual_seed(9)).tolist()
    parent = engine.prefill(ids, prot=PROT, query_window=64)
    return request.param, model, tok, parent


@pytest.mark.parametrize("name", BUILTIN)
def test_method_invariants(setup, name):
    family, model, tok, parent = setup
    method = _prepare(name, family, model, tok)
    scores = _score(method, parent)
    assert len(scores) == parent.n_attn_layers
    assert all(s.shape == (parent.n_kv_heads, N) and torch.isfinite(s[:, PROT:]).all() for s in scores)
    again = _score(_fresh(name, family, model, tok), parent)
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(scores, again, strict=True)), "not deterministic"

    L, H = parent.n_attn_layers, parent.n_kv_heads
    for allocation in method.allocations:
        for p in (0.9, 0.5, 0.1):
            kept = method.select(parent, scores, p, allocation)
            k = budgets.per_head_budget(N, PROT, p)
            body = [[len(idx) - PROT for idx in heads] for heads in kept]
            assert sum(map(sum, body)) == L * H * k, (allocation, p)
            if allocation != "global":
                assert all(len(set(heads)) == 1 for heads in body), "per-head counts differ within a layer"
            for heads in kept:
                for idx in heads:
                    assert idx[:PROT].tolist() == list(range(PROT))
                    assert bool((idx[1:] > idx[:-1]).all()) and 0 <= int(idx.min()) and int(idx.max()) < N
            parent.fork(kept).release()

    # p = 1.0: every allocation keeps everything, and the child answers exactly like the parent
    kept = method.select(parent, scores, 1.0, method.default_allocation)
    child = parent.fork(kept)
    question = [11, 12, 13, 14]
    ours = child.answer(question, max_new_tokens=6, context_sha256=parent.sha256, stop_ids=())
    ref = parent.answer(question, max_new_tokens=6, context_sha256=parent.sha256, stop_ids=())
    child.release()
    assert ours.token_ids == ref.token_ids and child.stats.kept_entries == child.stats.full_entries
