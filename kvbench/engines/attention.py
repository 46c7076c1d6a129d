"""The attention function kvbench runs Hugging Face hybrids with: ``kvbench_sdpa``.

SDPA with a bottom-right causal mask, so every attention layer may hold a different number of cached
entries while a multi-token question is fed in one block. A child layer whose KV heads keep different counts
is stored ragged, without padding (:class:`RaggedKV`: one packed buffer, per-head offsets), and attended with
one SDPA call per KV head. A float32 decoding step on CPU (one query) is attended by kvbench's decode-attention
kernel instead (:mod:`kvbench.engines.decode_kernel`), for a child alone as in a batch. Query recording
(``module.kvbench_query_sink``) and the per-row log-sum-exp that query-aware scoring reads happen here too.

Nothing is registered on import: :func:`register_attention` registers the function with transformers'
``AttentionInterface`` and returns :data:`ATTN_IMPL`, the ``attn_implementation`` to load models with::

    AutoModelForCausalLM.from_pretrained(path, attn_implementation=register_attention())
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from kvbench.engines import decode_kernel
from kvbench.engines.base import attention_logsumexp

__all__ = ["ATTN_IMPL", "RaggedKV", "kvbench_sdpa", "register_attention", "sdpa_with_lse"]

#: The name ``kvbench_sdpa`` is registered under (the models' ``config._attn_implementation``).
ATTN_IMPL = "kvbench_sdpa"


def register_attention() -> str:
    """Register :func:`kvbench_sdpa` with transformers' ``AttentionInterface`` under :data:`ATTN_IMPL` and
    return that name. Idempotent: every call registers the same function under the same name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPL, kvbench_sdpa)
    return ATTN_IMPL


def kvbench_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA with a bottom-right causal mask.

    query ``[1, H, q, D]``; key/value ``[1, H_kv, kv, D]``. When ``module.kvbench_ragged`` holds a
    :class:`RaggedKV` (a child layer whose heads keep different counts), key/value are only the entries
    fed after the context and each KV head attends to its own kept entries followed by them. When
    ``module.kvbench_batch`` holds a :class:`~kvbench.engines.batch_kv.BatchKV` (children answering in one
    batch), key/value ``[B, H_kv, q, D]`` are the ``q`` entries just fed and the batch holds everything else.
    """
    sink = getattr(module, "kvbench_query_sink", None)
    recorder = None
    if sink is not None:
        recorder, f = sink
        recorder.record_queries(f, query)
    batch = getattr(module, "kvbench_batch", None)
    if batch is not None:  # several children decoding together (kvbench.engines.batch_kv.BatchKV)
        return batch.attend(query, key, value, scaling).transpose(1, 2).contiguous(), None
    ragged = getattr(module, "kvbench_ragged", None)
    if ragged is not None:
        return _ragged_sdpa(query, key, value, ragged, scaling).transpose(1, 2).contiguous(), None
    if getattr(recorder, "wants_lse", False):
        out, lse = sdpa_with_lse(query, key, value, scaling)
        recorder.record_lse(f, lse[0])
    elif recorder is None and decode_kernel.applies(query):
        keys, values = _rows_contiguous(key[0]), _rows_contiguous(value[0])  # held: the jobs point into them
        out = decode_kernel.decode_step(query, decode_kernel.DecodeJobs.heads(keys, values), scaling)
    else:
        n_rep = query.shape[1] // key.shape[1]
        mask, is_causal = _causal(query.shape[2], key.shape[2], query.device)
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, is_causal=is_causal, scale=scaling, enable_gqa=n_rep > 1
        )
    return out.transpose(1, 2).contiguous(), None


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t`` ``[..., n, D]`` itself when its rows are contiguous, else a contiguous copy."""
    return t if t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] else t.contiguous()


def _causal(q_len: int, kv_len: int, device) -> tuple[torch.Tensor | None, bool]:
    """SDPA's ``(attn_mask, is_causal)`` for ``q_len`` queries that are the last of ``kv_len`` keys (bottom-right
    causal): no mask for one query, ``is_causal`` when queries and keys coincide, else a ``[q, kv]`` bool mask."""
    if q_len == kv_len and q_len > 1:
        return None, True
    if q_len > 1:
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(kv_len - q_len), False
    return None, False


def _ragged_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, ragged: RaggedKV, scale) -> torch.Tensor:
    """Attention over ragged per-head storage: ``key``/``value`` ``[1, H_kv, t, D]`` are the entries just fed,
    appended in place after those fed before (``ragged`` needs room for them: :meth:`RaggedKV.with_room`, so a
    decoding step copies no kept entry); KV head ``h`` then sees its ``counts[h]`` kept entries followed by every
    entry fed after the context, bottom-right causal. query ``[1, H, q, D]``; returns ``[1, H, q, D]``, one SDPA
    call per KV head (no padding anywhere)."""
    H_kv = key.shape[1]
    n_rep = query.shape[1] // H_kv
    ragged.append(key[0], value[0])
    if decode_kernel.applies(query):
        heads = [ragged.head_with_fed(h) for h in range(H_kv)]
        jobs = decode_kernel.DecodeJobs(
            [k.data_ptr() for k, _ in heads], [v.data_ptr() for _, v in heads], [len(k) for k, _ in heads],
            [0] * H_kv, [0] * H_kv,
        )  # fmt: skip
        return decode_kernel.decode_step(query, jobs, scale)
    out = []
    for h in range(H_kv):
        k, v = ragged.head_with_fed(h)
        mask, is_causal = _causal(query.shape[2], k.shape[0], query.device)
        q = query[:, h * n_rep : (h + 1) * n_rep]
        out.append(
            F.scaled_dot_product_attention(
                q, k[None, None], v[None, None], attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=True
            )
        )
    return torch.cat(out, 1)


def sdpa_with_lse(query, key, value, scale, fused: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Bottom-right causal attention (the ``q`` queries are the last ``q`` of the ``kv`` positions: a block fed
    after the cached context) and the float32 log-sum-exp of every query row's scaled logits over the keys it
    attends to, ``[1, H, q]``. query ``[1, H, q, D]``, key/value ``[1, H_kv, kv, D]``.

    On CPU the flash kernel that SDPA itself dispatches to returns both. A square block (``q == kv``) or one
    query is one call, bit-identical to SDPA. A probe after a context (``1 < q < kv``) is two calls with no
    ``[q, kv]`` mask built, merged by their log-sum-exps: the context keys ``0 .. kv-q`` (all visible) and the
    probe's own keys (square causal), ``lse = logaddexp(lse_c, lse_p)``, ``out = e^(lse_c - lse) out_c +
    e^(lse_p - lse) out_p`` in float32: SDPA's result up to float rounding, at the cost of the attention alone.
    Elsewhere (``fused=False``, other devices) SDPA runs with the mask and :func:`attention_logsumexp`
    recomputes the log-sum-exp (same value).
    """
    if scale is None:
        scale = query.shape[-1] ** -0.5
    if fused is None:
        fused = query.device.type == "cpu"
    q_len, kv_len = query.shape[2], key.shape[2]
    if fused:
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        if q_len == 1 or q_len == kv_len:
            out, lse = flash(query, key, value, 0.0, q_len > 1, scale=scale)
            return out, lse.float()
        n = kv_len - q_len
        out_c, lse_c = flash(query, key[:, :, :n], value[:, :, :n], 0.0, False, scale=scale)
        out_p, lse_p = flash(query, key[:, :, n:], value[:, :, n:], 0.0, True, scale=scale)
        lse_c, lse_p = lse_c.float(), lse_p.float()
        lse = torch.logaddexp(lse_c, lse_p)
        out = out_c.float() * (lse_c - lse).exp_()[..., None] + out_p.float() * (lse_p - lse).exp_()[..., None]
        return out.to(query.dtype), lse
    mask, is_causal = _causal(q_len, kv_len, query.device)
    n_rep = query.shape[1] // key.shape[1]
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=n_rep > 1
    )
    visible = mask  # None for one query (sees everything) or a square block (causal):
    if visible is None:
        visible = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
    return out, attention_logsumexp(query[0], key[0], visible, scale)[None]


class RaggedKV:
    """A child attention layer whose KV heads keep different counts, stored without padding.

    keys / values ``[sum(counts) + H_kv * room, D]``: head ``h``'s kept entries (in position order) at rows
    ``offsets[h] .. offsets[h] + counts[h] - 1``, then ``room`` rows for entries fed after the context (the first
    ``fed`` of them written). A child stores its layer with ``room = 0`` (exactly the kept entries); an answer works
    on a copy with room (:meth:`with_room`), appended to in place as the question and answer tokens are fed
    (:meth:`append`).
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, counts: Sequence[int], room: int = 0) -> None:
        self.keys, self.values, self.counts, self.room = keys, values, list(counts), room
        self.fed = 0
        self.offsets = [0]
        for c in self.counts:
            self.offsets.append(self.offsets[-1] + c + room)
        if keys.shape[0] != self.offsets[-1] or values.shape[0] != self.offsets[-1]:
            raise ValueError(f"ragged storage of {keys.shape[0]} rows; counts {self.counts} with room {room} need "
                             f"{self.offsets[-1]}")  # fmt: skip

    def head_keys(self, h: int) -> torch.Tensor:
        """``[counts[h], D]``, a view into :attr:`keys`."""
        return self.keys[self.offsets[h] : self.offsets[h] + self.counts[h]]

    def head_values(self, h: int) -> torch.Tensor:
        return self.values[self.offsets[h] : self.offsets[h] + self.counts[h]]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys, self.values

    def with_room(self, room: int) -> RaggedKV:
        """A copy (new storage) of the kept entries with ``room`` free rows after each head's."""
        shape = (sum(self.counts) + len(self.counts) * room, self.keys.shape[-1])
        keys, values = self.keys.new_empty(shape), self.values.new_empty(shape)
        work = RaggedKV(keys, values, self.counts, room)
        for h in range(len(self.counts)):
            work.head_keys(h).copy_(self.head_keys(h))
            work.head_values(h).copy_(self.head_values(h))
        return work

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write entries just fed after the context, ``keys`` / ``values`` ``[H_kv, q, D]``, after every head's
        earlier ones (a few rows; the kept entries are not copied)."""
        q = keys.shape[1]
        if self.fed + q > self.room:
            raise ValueError(f"fed {self.fed + q} entries after the context; the layer has room for {self.room}")
        for h in range(len(self.counts)):
            at = self.offsets[h] + self.counts[h] + self.fed
            self.keys[at : at + q] = keys[h]
            self.values[at : at + q] = values[h]
        self.fed += q

    def head_with_fed(self, h: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``[counts[h] + fed, D]``: head ``h``'s kept entries followed by the entries fed after the context."""
        end = self.offsets[h] + self.counts[h] + self.fed
        return self.keys[self.offsets[h] : end], self.values[self.offsets[h] : end]
