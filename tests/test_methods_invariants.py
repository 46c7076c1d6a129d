"""One invariant suite over every registered method, both model families and every allocation: exact budgets,
protected prefix kept, sorted unique indices, determinism under a seed, and keep-all (p = 1.0) children answering
token-identically to the parent.

Every method is made by its own :meth:`EvictionMethod.prepare_offline` on the same tiny model (a method that scores
with an offline artifact makes a small one there), so the suite names no method: a registered method, a plugin's
included, is covered as it is, and one without the artifact it needs fails here rather than being skipped. Every
registered allocation is checked on its own too. Names starting ``test-`` are left out: other test modules register
them as throwaway fixtures (a method that raises, one with missing scores, ...), not as methods.
"""

from __future__ import annotations

import copy

import pytest
import torch

from kvbench import allocations, budgets
from kvbench.engines.torch_engine import TorchEngine
from kvbench.methods import QuestionInput, list_methods, method_class
from kvbench.models import byte_tokenizer
from tests.conftest import tiny_model

N, PROT = 240, 12
FAMILIES = ("qwen3_next", "qwen3_5")
METHODS = [m for m in list_methods() if not m.startswith("test-")]
ALLOCATIONS = list(allocations.ALLOCATIONS)
_PREPARED: dict = {}


def _prepare(name: str, family: str, model, tok, workdir):
    """The method ``name`` made by its :meth:`prepare_offline` for ``model`` (once per family), on one thread (many
    small ops: on a loaded 2-core box two threads are much slower)."""
    key = (name, family)
    if key not in _PREPARED:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            (workdir / f"{name}-{family}").mkdir()
            _PREPARED[key] = method_class(name).prepare_offline(model, tok, workdir / f"{name}-{family}", seed=3)
        finally:
            torch.set_num_threads(threads)
    return _PREPARED[key]


def _score(method, parent):
    """``score``, or for a query-aware method ``score_question`` of one fixed question."""
    if method.query_aware:
        return method.score_question(parent, QuestionInput((11, 12, 13, 14), 6))
    return method.score(parent)


def _check_kept(kept, allocation: str, p: float, L: int, H: int) -> None:
    """``kept`` holds the exact budget at ``p``, the protected prefix and sorted in-range positions; a per-layer
    allocation keeps one count per layer."""
    k = budgets.per_head_budget(N, PROT, p)
    body = [[len(idx) - PROT for idx in heads] for heads in kept]
    assert len(kept) == L and all(len(heads) == H for heads in kept), (allocation, p)
    assert sum(map(sum, body)) == L * H * k, (allocation, p)
    if isinstance(allocations.get_allocation(allocation), allocations.LayerAllocation):
        assert all(len(set(heads)) == 1 for heads in body), "per-head counts differ within a layer"
    for heads in kept:
        for idx in heads:
            assert idx[:PROT].tolist() == list(range(PROT))
            assert bool((idx[1:] > idx[:-1]).all()) and 0 <= int(idx.min()) and int(idx.max()) < N


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Where methods prepared for this module write their artifacts."""
    return tmp_path_factory.mktemp("prepared")


@pytest.fixture(scope="module", params=FAMILIES)
def setup(request):
    model = tiny_model(request.param)
    tok = byte_tokenizer()
    engine = TorchEngine(model, tok)
    ids = torch.randint(0, 256, (N,), generator=torch.Generator().manual_seed(9)).tolist()
    parent = engine.prefill(ids, prot=PROT, query_window=64)
    return request.param, model, tok, parent


@pytest.mark.parametrize("name", METHODS)
def test_method_invariants(setup, workdir, name):
    family, model, tok, parent = setup
    method = _prepare(name, family, model, tok, workdir)
    scores = _score(method, parent)
    assert len(scores) == parent.n_attn_layers
    assert all(s.shape == (parent.n_kv_heads, N) and torch.isfinite(s[:, PROT:]).all() for s in scores)
    again = _score(copy.copy(method), parent)
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(scores, again, strict=True)), "not deterministic"

    L, H = parent.n_attn_layers, parent.n_kv_heads
    for allocation in method.allocations:
        for p in (0.9, 0.5, 0.1):
            kept = method.select(parent, scores, p, allocation)
            _check_kept(kept, allocation, p, L, H)
            parent.fork(kept).release()

    # p = 1.0: every allocation keeps everything, and the child answers exactly like the parent
    kept = method.select(parent, scores, 1.0, method.default_allocation)
    child = parent.fork(kept)
    question = [11, 12, 13, 14]
    ours = child.answer(question, max_new_tokens=6, context_sha256=parent.sha256, stop_ids=())
    ref = parent.answer(question, max_new_tokens=6, context_sha256=parent.sha256, stop_ids=())
    child.release()
    assert ours.token_ids == ref.token_ids and child.stats.kept_entries == child.stats.full_entries


@pytest.mark.parametrize("allocation", ALLOCATIONS)
def test_allocation_invariants(setup, allocation):
    """Every registered allocation on random scores, given the parent's gate means when it declares it needs them:
    exact budgets at every p, one count per layer for a per-layer allocation, a valid fork, keep-all at p = 1."""
    family, model, tok, parent = setup
    chosen = allocations.get_allocation(allocation)
    g = torch.Generator().manual_seed(5)
    scores = [torch.rand(parent.n_kv_heads, N, generator=g) for _ in range(parent.n_attn_layers)]
    means = parent.gate_means() if chosen.needs_gate_means else None
    for p in (*budgets.ALL_P, 1.0):
        kept = chosen.select(scores, N, PROT, p, means)
        _check_kept(kept, allocation, p, parent.n_attn_layers, parent.n_kv_heads)
    assert all(idx.tolist() == list(range(N)) for heads in kept for idx in heads)  # p = 1.0 keeps everything
    parent.fork(kept).release()
