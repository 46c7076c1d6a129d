"""``kvzip``: score each cached entry by the attention it receives while the model reconstructs the context.

KVzip (Kim et al., 2025; reference ``snu-mllab/KVzip``, ``model/wrapper.py`` ``self_task`` / ``scoring``,
``attention/score.py``) runs a second pass over the context. The body (positions ``prot .. n-1``) is cut
into chunks of ``chunk_size`` tokens; for chunk ``c`` the probe fed after the full context is::

    "\\n\\nRepeat the previous context exactly."                                   (c = 0)
    "\\n\\nRepeat the part of the previous context exactly, starting with " + last 8 tokens of chunk c-1
    + the chat template's end of user turn and assistant header + the tokens of chunk c

with the GDN states restored to the end of the context before every chunk and nothing written into the
parent (``parent.probe``). In every attention layer the probe's post-RoPE queries attend to the cached
context keys and, causally, to the probe's own keys; the score of context entry ``i`` of chunk ``c`` is the
maximum, over the query heads of its KV head and over all probe positions of chunk ``c``, of the softmax
attention weight it receives: ``exp(logit - lse)`` with the probe row's log-sum-exp ``lse`` (which the torch
engine takes from the probe's own attention kernel), so only the chunk's logits are formed here. Scores
are attention probabilities, comparable across layers, so the default allocation is ``global`` (one top-B
over layer x head x token; counts may differ per head).

Deviations from the reference, each deliberate:

* the softmax runs over the whole cache (protected prefix + every context entry + the probe), exactly the
  distribution the real forward uses; the reference restricts the score softmax to
  [system prompt | chunk | probe];
* the softmax is float32 whatever the model dtype (float32 logits of the chunk's keys minus a float32
  log-sum-exp); the reference computes its score softmax in the model dtype (float32 only for a float32
  model, e.g. the CPU default here);
* the protected prefix (chat header + instruction, <= 256 tokens) plays the reference's system-prompt
  sink: it is never scored for eviction and always kept;
* chunk size 2048 (kvpress; the reference uses 2000), 8 prefix tokens from the previous chunk as in both.
"""

from __future__ import annotations

import torch

from kvbench.engines.base import attention_logsumexp
from kvbench.errors import KvbenchError
from kvbench.methods import EvictionMethod, register_method
from kvbench.prompt import encode, template_parts

FIRST_PROMPT = "\n\nRepeat the previous context exactly."
NEXT_PROMPT = "\n\nRepeat the part of the previous context exactly, starting with "


def chunk_attention_max(
    queries: torch.Tensor, chunk_keys: torch.Tensor, lse: torch.Tensor, scale: float, block_elems: int = 1 << 26
) -> torch.Tensor:
    """Max attention weight each key of a context chunk receives from a probe.

    queries ``[H, T, D]`` (probe positions), chunk_keys ``[H_kv, c, D]`` (the chunk's cached keys, all visible
    to every probe row), lse ``[H, T]``: each probe row's float32 log-sum-exp over every key it attends to
    (the whole cache and the probe keys ``0..t``, see :func:`kvbench.engines.base.attention_logsumexp`).
    The weight of key ``i`` for row ``t`` is ``exp(scale * q_t.k_i - lse_t)``, exactly the softmax entry of
    the full distribution, so only the ``T x c`` logits of the chunk are formed (one fused multiply-add per
    block: ``baddbmm(-lse, scale * q, k^T)``, then ``exp`` in place). Returns ``[H_kv, c]``: max over the query
    heads of each KV head and over ``t`` (float32). The query heads of one KV head (``h // (H / H_kv)``) are
    taken together as ``group * T`` rows, in blocks of about ``block_elems`` logits.
    """
    H, T, D = queries.shape
    H_kv, c, _ = chunk_keys.shape
    rows_all = (H // H_kv) * T
    q = (queries.float() * scale).reshape(H_kv, rows_all, D)  # query heads of KV head g are rows of g
    neg_lse = lse.to(queries.device, torch.float32).neg().reshape(H_kv, rows_all, 1)
    keys_t = chunk_keys.float().transpose(1, 2)  # [H_kv, D, c]
    out = torch.zeros(H_kv, c, dtype=torch.float32, device=queries.device)
    rows = max(1, block_elems // (H_kv * max(c, 1)))
    for start in range(0, rows_all, rows):
        weights = torch.baddbmm(neg_lse[:, start : start + rows], q[:, start : start + rows], keys_t).exp_()
        torch.maximum(out, weights.amax(1), out=out)
    return out


@register_method
class KVzip(EvictionMethod):
    """Context-reconstruction attention (second pass over the context), global top-B allocation."""

    name = "kvzip"
    default_allocation = "global"
    extra_passes = True
    chunk_size = 2048
    prev_tokens = 8

    def probes(self, parent) -> list[tuple[int, int, list[int]]]:
        """(start, end, probe token ids) per body chunk."""
        tok = parent.tokenizer
        if tok is None:
            raise KvbenchError("kvzip builds reconstruction prompts and needs the engine's tokenizer")
        _, tail = template_parts(tok)
        ids = parent.token_ids
        out = []
        for start in range(parent.prot, parent.n, self.chunk_size):
            end = min(start + self.chunk_size, parent.n)
            if start == parent.prot:
                prompt = encode(tok, FIRST_PROMPT)
            else:
                prompt = encode(tok, NEXT_PROMPT) + ids[start - self.prev_tokens : start]
            out.append((start, end, prompt + encode(tok, tail) + ids[start:end]))
        return out

    def score(self, parent):
        scores = [torch.zeros(parent.n_kv_heads, parent.n) for _ in range(parent.n_attn_layers)]
        scale = parent.head_dim**-0.5
        for start, end, probe in self.probes(parent):
            for f, layer in enumerate(parent.probe(probe)):
                queries, probe_keys = layer[0], layer[1]
                lse = layer[2] if len(layer) > 2 else self._lse(parent.keys(f), queries, probe_keys, scale)
                got = chunk_attention_max(queries, parent.keys(f)[:, start:end], lse, scale)
                scores[f][:, start:end] = got.to(scores[f].device)
        return scores

    @staticmethod
    def _lse(ctx_keys: torch.Tensor, queries: torch.Tensor, probe_keys: torch.Tensor, scale: float) -> torch.Tensor:
        """Probe rows' log-sum-exp for engines whose probe does not return it: every context key plus the
        probe keys ``0..t`` (a full pass over the logits, as costly as the attention itself)."""
        n, T = ctx_keys.shape[1], probe_keys.shape[1]
        visible = torch.ones(T, n + T, dtype=torch.bool, device=queries.device).tril(n)
        return attention_logsumexp(queries, torch.cat([ctx_keys, probe_keys], 1), visible, scale)
