"""``snapkv``: SnapKV in its query-agnostic form (Li et al., 2024, arXiv 2404.14469).

The last ``window`` context tokens act as the observation window: their post-RoPE queries attend over the
cached keys, and the attention each cached entry receives from the window, smoothed by a max-pool along
tokens, is its score.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kvbench.engines.base import ParentSession
from kvbench.methods import EvictionMethod, register_method


def window_attention(queries: torch.Tensor, keys: torch.Tensor, window_start: int) -> torch.Tensor:
    """Causal softmax attention of window queries over all keys, in float32.

    queries ``[H, W, D]`` are the queries of context positions ``window_start .. window_start + W - 1``;
    keys ``[H_kv, n, D]`` (``H`` a multiple of ``H_kv``; query head ``h`` reads KV head ``h // G``).
    Returns ``[H, W, n]``; the query at position ``t`` gives zero weight to keys after ``t``.
    """
    H, W, D = queries.shape
    H_kv, n, _ = keys.shape
    q = queries.float().view(H_kv, H // H_kv, W, D)
    logits = torch.einsum("kgwd,knd->kgwn", q, keys.float()) / math.sqrt(D)
    pos_q = torch.arange(window_start, window_start + W, device=logits.device)
    future = torch.arange(n, device=logits.device)[None, :] > pos_q[:, None]  # [W, n]
    logits = logits.masked_fill(future, float("-inf"))
    return torch.softmax(logits, dim=-1).reshape(H, W, n)


@register_method
class SnapKV(EvictionMethod):
    """Query-agnostic SnapKV: observation window = the last 32 context tokens, max-pooled attention.

    Per attention layer:

    1. The post-RoPE queries of the last ``W = min(32, n)`` context positions (the model's own q/gate
       split, q_norm and partial RoPE, recorded in the prefill) attend over all ``n`` cached keys:
       ``softmax(q k^T / sqrt(D))`` in float32, causal inside the window.
    2. Each key's score is the attention it receives **summed** over the ``W`` window queries.
    3. Scores are max-pooled along tokens (kernel 7, padding 3, stride 1; padding never wins) per query
       head.
    4. GQA: the pooled scores of the ``G`` query heads of a KV head are **averaged** (mean over the group).

    **Window keys compete normally** (``keep_window = False``): the window is part of the body, its keys
    are scored by the same causal attention sum (a window key at position ``t`` is seen only by the window
    queries at ``t`` and later, so the last window keys collect attention from fewer queries) and are
    pooled together with the rest. Set ``keep_window = True`` (subclass or instance attribute) to get the
    original behaviour: the window keys are excluded from scoring and pooling and always kept (score
    above every other entry of their head).

    Differences from the reference implementations:

    * original SnapKV (FasterDecoding/SnapKV ``SnapKVCluster.update_kv``): it keeps the window
      unconditionally on top of a capacity (here, by default, the window competes inside the flat
      budget); it runs only when the prompt exceeds the capacity; its defaults are window 32, kernel 5,
      avg-pool (we use its LongBench setting: window 32, kernel 7, max-pool); it stores the cache per
      *query* head (``repeat_kv`` before selection), so it needs no GQA rule, whereas kvbench keeps one
      set per KV head and averages over the group. Softmax, float32, summation over the window and
      pooling padding ``kernel // 2`` are the same.
    * kvpress ``SnapKVPress``: window 64, kernel 5, ``avg_pool1d``, mean (not sum) over the window
      queries (a uniform scale, no effect on the per-head ranking), window always kept (padded with the
      maximum score), and it recomputes the window queries from the hidden states, which fails on
      Qwen3-Next: its query extraction applies RoPE over every head dim, while these models rotate only
      ``partial_rotary_factor`` of them, a shape error (it never gets to the q/gate split); here the
      queries come from the prefill itself. Its GQA rule (mean over the group) is the one used here.
    * the protected prefix is always kept by the harness; its keys are scored and pooled like any other.
    """

    name = "snapkv"
    default_allocation = "flat"
    query_window = 32
    kernel_size = 7
    keep_window = False

    def score(self, parent: ParentSession) -> list[torch.Tensor]:
        n, H, H_kv = parent.n, parent.n_heads, parent.n_kv_heads
        W = min(self.query_window, n)
        start = n - W
        if self.keep_window and start == 0:
            # the window is the whole context: every entry is a kept window entry, all score alike
            return [torch.ones(H_kv, n, device=parent.keys(f).device) for f in range(parent.n_attn_layers)]
        pad = self.kernel_size // 2
        out = []
        for f in range(parent.n_attn_layers):
            keys = parent.keys(f)
            attn = window_attention(parent.queries(f, range(start, n)), keys, start)  # [H, W, n]
            summed = attn.sum(dim=1)  # [H, n]
            body = summed[:, :start] if self.keep_window else summed  # [H, m], m >= 1
            pooled = F.max_pool1d(body[:, None, :], kernel_size=self.kernel_size, stride=1, padding=pad)[:, 0]
            scores = pooled.view(H_kv, H // H_kv, -1).mean(dim=1)  # [H_kv, m]
            if self.keep_window:  # the window's W entries rank above every scored entry of their head
                top = scores.amax(dim=1, keepdim=True)
                scores = torch.cat([scores, (top + 1).expand(H_kv, W)], dim=1)
            out.append(scores)
        return out
