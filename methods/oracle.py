"""``oracle``: the query-aware ceiling. Unlike every other method it sees the question.

For each question of a context, the unpruned parent first answers it (the harness's greedy loop, full
cache); then the question tokens followed by that answer are teacher-forced after the context in one block
(``parent.probe``: GDN states restored to the end of the context, positions continuing from ``n``, nothing
written into the parent). Every context entry ``i`` of attention layer ``f``, KV head ``h`` is scored by the
future KV utility of Eq. 2 (the GateSight label, :mod:`kvbench.methods.kv_utility`) over those rows::

    U(i) = max_t || Σ_{j ∈ Q(h)} a_j(t,i) / (1 - a_j(t,i)) · W_O^(j) (v_i - o_j(t)) ||

``t`` running over every teacher-forced position (the last question token predicts the first answer token,
the last answer token predicts the stop), ``a``/``o`` the attention weights and ungated head outputs of those
rows over the whole cache (context + the forced tokens, causally), computed in float64. ``U(i)`` is the
exact change of the layer's ungated attention output when entry ``i`` alone is deleted, at the row where it
matters most. Entries are kept by that score under the method's allocation (default ``gate``, overridable).

It is an upper reference, not a competitor: its rows carry ``query_aware: true`` and reports draw it as a
ceiling. The runner scores and forks it once per (question, allocation, p), from the one parent prefill.

Settings and limits:

* torch engine only: Eq. 2 needs each attention layer's output projection ``W_O``, read from the model's
  attention modules, which only an engine holding the model in this process through a
  :class:`~kvbench.engines.hf_adapters.HybridAdapter` (``engine.adapter``) exposes;
* the forced tokens' values (needed for ``o``) are read by a forward hook on each attention layer's
  ``v_proj`` during the probe (the values of Qwen3-Next / Qwen3.5 attention are ``v_proj``'s output as is);
* the answer is the parent's own greedy answer within the question's ``max_new_tokens`` (stop token
  excluded); the gold references are never used.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvbench.engines.base import ParentSession
from kvbench.errors import KvbenchError, ModelError
from kvbench.methods import QueryAwareMethod, QuestionInput, register_method
from kvbench.methods.kv_utility import (
    delta_r_closed_form,
    head_output_weights,
    recompute_attention,
    utility_from_delta,
)

__all__ = ["Oracle", "forced_utility", "probe_with_values"]

#: float64 elements of the per-chunk ``[H_kv, G, G, rows, n]`` products of the closed form (~256 MB)
CHUNK_ELEMS = 1 << 25


def _attention_modules(parent: ParentSession) -> list[torch.nn.Module]:
    """The model's attention modules by layer ordinal, from the parent's engine's HF adapter (the torch engine's;
    an engine without one, such as vLLM's, is a :class:`KvbenchError` naming ``--engine torch``)."""
    from kvbench.engines.hf_adapters import HybridAdapter

    adapter = getattr(getattr(parent, "engine", None), "adapter", None)
    if not isinstance(adapter, HybridAdapter):
        raise KvbenchError(
            "oracle reads each attention layer's output projection from the model, which only the torch engine "
            "exposes; run it with --engine torch"
        )
    return adapter.attn


@torch.no_grad()
def probe_with_values(
    parent: ParentSession, modules: Sequence[torch.nn.Module], token_ids: Sequence[int]
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``parent.probe(token_ids)`` plus the probe tokens' values: per attention layer ordinal, queries
    ``[H, T, D]`` (post-RoPE), keys ``[H_kv, T, D]`` (post-RoPE) and values ``[H_kv, T, D]`` of the ``T`` tokens
    fed after the context. ``modules``: the attention modules, by ordinal (their ``v_proj`` is hooked)."""
    T = len(token_ids)
    captured: list[list[torch.Tensor]] = [[] for _ in modules]
    handles = [
        mod.v_proj.register_forward_hook(lambda m_, i_, out, f=f: captured[f].append(out.detach()[0]))
        for f, mod in enumerate(modules)
    ]
    try:
        probed = parent.probe(list(token_ids))
    finally:
        for handle in handles:
            handle.remove()
    out = []
    for f, (q, k, *_) in enumerate(probed):  # a torch probe also returns each row's log-sum-exp
        if len(captured[f]) != 1 or captured[f][0].shape[0] != T:
            raise ModelError(
                f"attention layer {modules[f].layer_idx}: the probe ran v_proj {len(captured[f])} times instead of "
                f"once on {T} tokens; the oracle's value capture no longer matches the engine"
            )
        v = captured[f][0].view(T, k.shape[0], k.shape[-1]).transpose(0, 1)
        out.append((q, k, v))
    return out


@torch.no_grad()
def forced_utility(parent: ParentSession, token_ids: Sequence[int]) -> list[torch.Tensor]:
    """Eq. 2 utility of every context entry for the rows of ``token_ids`` teacher-forced after the context:
    per attention layer ordinal, ``[H_kv, n]`` float32 (max over the forced rows of the joint leave-one-out
    change of the ungated attention output, in units of the residual stream)."""
    modules = _attention_modules(parent)
    n, H, H_kv = parent.n, parent.n_heads, parent.n_kv_heads
    G = H // H_kv
    chunk = max(1, min(32, CHUNK_ELEMS // max(1, H_kv * G * G * n)))
    scores = []
    for f, (mod, (q, k_new, v_new)) in enumerate(zip(modules, probe_with_values(parent, modules, token_ids),
                                                     strict=True)):  # fmt: skip
        k = torch.cat([parent.keys(f), k_new.to(parent.keys(f).dtype)], dim=1)
        v = torch.cat([parent.values(f), v_new.to(parent.values(f).dtype)], dim=1)
        a, o = recompute_attention(q, k, v, mod.scaling, dtype=torch.float64)
        w_heads = head_output_weights(mod.o_proj.weight.detach().double(), H)
        delta = delta_r_closed_form(a, o, v, w_heads, n, chunk=chunk)  # [H_kv, T, n]
        scores.append(utility_from_delta(delta).float())
    return scores


@register_method
class Oracle(QueryAwareMethod):
    """Query-aware ceiling: per question, Eq. 2 utility of the question + full-cache answer tokens."""

    name = "oracle"
    default_allocation = "gate"
    extra_passes = True
    requires = frozenset({"model_weights"})  # the engine's adapter exposes W_O; checked before any model loads

    def full_cache_answer(self, parent: ParentSession, question: QuestionInput) -> list[int]:
        """The unpruned parent's greedy answer to ``question`` (token ids, stop token excluded)."""
        answer = parent.answer(
            list(question.token_ids), max_new_tokens=question.max_new_tokens, context_sha256=parent.sha256
        )
        return answer.token_ids

    def score_question(self, parent: ParentSession, question: QuestionInput) -> list[torch.Tensor]:
        _attention_modules(parent)  # an unsupported engine fails before the answer is decoded
        forced = list(question.token_ids) + self.full_cache_answer(parent, question)
        return forced_utility(parent, forced)
