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
attention weight (float32) it receives. Scores are attention probabilities, comparable across layers, so
the default allocation is ``global`` (one top-B over layer x head x token; counts may differ per head).

Deviations from the reference, each deliberate:

* the softmax runs over the whole cache (protected prefix + every context entry + the probe), exactly the
  distribution the real forward uses; the reference restricts the score softmax to
  [system prompt | chunk | probe];
* the protected prefix (chat header + instruction, <= 256 tokens) plays the reference's system-prompt
  sink: it is never scored for eviction and always kept;
* chunk size 2048 (kvpress; the reference uses 2000), 8 prefix tokens from the previous chunk as in both.
"""

from __future__ import annotations

import torch

from kvbench.errors import KvbenchError
from kvbench.methods import EvictionMethod, register_method
from kvbench.prompt import encode, template_parts

FIRST_PROMPT = "\n\nRepeat the previous context exactly."
NEXT_PROMPT = "\n\nRepeat the part of the previous context exactly, starting with "


def chunk_attention_max(
    queries: torch.Tensor, ctx_keys: torch.Tensor, probe_keys: torch.Tensor, scale: float, block_elems: int = 1 << 26
) -> torch.Tensor:
    """Max attention each context entry receives from a probe.

    queries ``[H, T, D]`` (probe positions), ctx_keys ``[H_kv, n, D]`` (cached context), probe_keys
    ``[H_kv, T, D]``. Probe row ``t`` attends to all ``n`` context keys and probe keys ``0..t``. Returns
    ``[H_kv, n]``: max over the query heads of each KV head and over ``t`` of the softmax weight (float32).
    Query rows are processed in blocks of about ``block_elems`` logits to bound memory.
    """
    H, T, _ = queries.shape
    H_kv, n, _ = ctx_keys.shape
    group = H // H_kv
    keys = torch.cat([ctx_keys, probe_keys], dim=1).float().repeat_interleave(group, 0)  # [H, n+T, D]
    out = torch.zeros(H, n, dtype=torch.float32, device=queries.device)
    rows = max(1, block_elems // (H * (n + T)))
    for start in range(0, T, rows):
        q = queries[:, start : start + rows].float()  # [H, r, D]
        logits = torch.einsum("hrd,hkd->hrk", q, keys) * scale
        r = q.shape[1]
        future = torch.arange(T, device=q.device)[None, :] > torch.arange(start, start + r, device=q.device)[:, None]
        logits[:, :, n:].masked_fill_(future[None], float("-inf"))
        out = torch.maximum(out, logits.softmax(-1)[:, :, :n].amax(1))
    return out.view(H_kv, group, n).amax(1)


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
            for f, (queries, probe_keys) in enumerate(parent.probe(probe)):
                got = chunk_attention_max(queries, parent.keys(f), probe_keys, scale)
                scores[f][:, start:end] = got[:, start:end].to(scores[f].device)
        return scores
