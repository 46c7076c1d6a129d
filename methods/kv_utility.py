"""Future KV utility (Eq. 2 of the GateSight paper), shared by the methods that score with it (``gatesight``'s
labels, the query-aware ``oracle``): the exact change of an attention layer's ungated output when one context
entry is deleted.

For an attention layer, KV head ``h`` with query heads ``Q(h)``, a row ``t`` (a query position after the
context) and a context entry ``i``::

    Δr(t, i) = || Σ_{j ∈ Q(h)} a_j(t,i) / (1 - a_j(t,i)) · W_O^(j) (v_i - o_j(t)) ||,   U(i) = max_t Δr(t, i)

``a_j(t, i)`` is the attention weight of row ``t`` of query head ``j`` on entry ``i``, ``o_j(t)`` the head's
(ungated) output and ``W_O^(j)`` the ``o_proj`` columns of head ``j``. Removing entry ``i`` from the softmax of
head ``j`` turns ``o_j`` into ``(o_j - a_j v_i) / (1 - a_j)``, a change of ``a_j/(1-a_j) (o_j - v_i)``, so
``Δr`` is the exact joint leave-one-out change of the ungated layer output (output gate left out), in units of
the residual stream.

Closed form (:func:`delta_r_closed_form`), with the cross-head metric ``M_jk = W_O^(j)ᵀ W_O^(k)``
(``[D, D]``) and ``c_j = a_j/(1-a_j)``::

    Δr² = Σ_jk c_j c_k ( v_iᵀM_jk v_i  +  o_jᵀM_jk o_k  -  2 v_iᵀM_jk o_k )

(the middle term uses the symmetry of the double sum). The entry term ``v_iᵀM_jk v_i`` depends on the
entry alone and is computed once per entry; the rest are ``[D, D]``-metric products, so nothing of the
model width is materialised per (row, entry) pair. :func:`delta_r_brute_force` deletes the entry from the
softmax and recomputes everything, the reference the closed form is checked against.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "delta_r_brute_force",
    "delta_r_closed_form",
    "head_output_weights",
    "recompute_attention",
    "utility_from_delta",
]


def head_output_weights(w_o: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``o_proj.weight`` ``[hidden, H*D]`` -> per query head ``W_O^(j)`` ``[H, hidden, D]``."""
    hidden, width = w_o.shape
    return w_o.view(hidden, n_heads, width // n_heads).permute(1, 0, 2)


def recompute_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of the last ``T`` rows over all ``N`` keys.

    q ``[H, T, D]`` post-RoPE queries of the key positions ``N-T .. N-1``; k, v ``[H_kv, N, D]``. Returns the
    weights ``a`` ``[H_kv, G, T, N]`` and the ungated head outputs ``o`` ``[H_kv, G, T, D]`` in ``dtype``
    (``G = H / H_kv``; query head ``h*G + g`` belongs to KV head ``h``, the HF GQA layout).
    """
    H, T, D = q.shape
    H_kv, N, _ = k.shape
    if N < T:
        raise ValueError(f"{T} query rows but only {N} keys")
    qg = q.to(dtype).reshape(H_kv, H // H_kv, T, D)
    logits = torch.einsum("hgtd,hnd->hgtn", qg, k.to(dtype)) * scaling
    visible = torch.ones(T, N, dtype=torch.bool, device=q.device).tril(N - T)
    a = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    o = torch.einsum("hgtn,hnd->hgtd", a, v.to(dtype))
    return a, o


def delta_r_closed_form(
    a: torch.Tensor,
    o: torch.Tensor,
    v: torch.Tensor,
    w_heads: torch.Tensor,
    n_ctx: int,
    *,
    chunk: int = 32,
) -> torch.Tensor:
    """Eq. 2 in closed form: ``Δr`` ``[H_kv, T, n_ctx]`` for every row and every context entry ``< n_ctx``.

    a, o: from :func:`recompute_attention`; v ``[H_kv, N, D]``; w_heads ``[H, hidden, D]``
    (:func:`head_output_weights`). Computed in ``a``'s dtype, ``chunk`` rows at a time.
    """
    H_kv, G, T, N = a.shape
    dtype = a.dtype
    D = v.shape[-1]
    W = w_heads.to(dtype).reshape(H_kv, G, -1, D)
    M = torch.einsum("hjed,hkef->hjkdf", W, W)  # [H_kv, G, G, D, D]
    vc = v[:, :n_ctx].to(dtype)
    A = torch.einsum("hjkdf,hnd,hnf->hjkn", M, vc, vc)  # entry term, once per entry
    X = torch.einsum("hjkdf,hktf->hjktd", M, o)  # M_jk o_k(t)
    C = torch.einsum("hjtd,hjktd->hjkt", o, X)  # o_j M_jk o_k
    ac = a[..., :n_ctx]
    c = ac / (1 - ac).clamp_min(torch.finfo(dtype).tiny)  # [H_kv, G, T, n]
    out = torch.empty(H_kv, T, n_ctx, dtype=dtype, device=a.device)
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        cc = c[:, :, t0:t1]
        cjk = cc[:, :, None] * cc[:, None, :]  # [H_kv, G, G, tc, n]
        B = torch.einsum("hnd,hjktd->hjktn", vc, X[:, :, :, t0:t1])  # v_i M_jk o_k(t)
        sq = (cjk * (A[:, :, :, None, :] + C[:, :, :, t0:t1, None] - 2 * B)).sum(dim=(1, 2))
        out[:, t0:t1] = sq.clamp_min(0).sqrt()
    return out


def delta_r_brute_force(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w_heads: torch.Tensor,
    scaling: float,
    entries: Sequence[int],
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Reference for Eq. 2 by deletion: ``[H_kv, T, len(entries)]``.

    For each entry the key is removed from the softmax of every query head of its group (its logit set to
    ``-inf``), the attention is recomputed, and the change of ``Σ_j W_O^(j) o_j`` is measured, all in ``dtype``.
    """
    H, T, D = q.shape
    H_kv, N, _ = k.shape
    G = H // H_kv
    qg = q.to(dtype).reshape(H_kv, G, T, D)
    kk, vv = k.to(dtype), v.to(dtype)
    W = w_heads.to(dtype).reshape(H_kv, G, -1, D)
    logits = torch.einsum("hgtd,hnd->hgtn", qg, kk) * scaling
    visible = torch.ones(T, N, dtype=torch.bool, device=q.device).tril(N - T)
    logits = logits.masked_fill(~visible, float("-inf"))
    base = torch.einsum("hgtn,hnd->hgtd", torch.softmax(logits, -1), vv)
    out = torch.empty(H_kv, T, len(entries), dtype=dtype, device=q.device)
    for e, i in enumerate(entries):
        deleted = logits.clone()
        deleted[..., int(i)] = float("-inf")
        o_del = torch.einsum("hgtn,hnd->hgtd", torch.softmax(deleted, -1), vv)
        change = torch.einsum("hjed,hjtd->hte", W, o_del - base)  # Σ_j W_O^(j) (o_j' - o_j)
        out[:, :, e] = change.norm(dim=-1)
    return out


def utility_from_delta(delta: torch.Tensor) -> torch.Tensor:
    """``U(i) = max_t Δr(t, i)``: ``[..., T, n] -> [..., n]``."""
    return delta.amax(dim=-2)
