"""The reference engine: HF transformers hybrids in PyTorch (CPU or GPU).

* Attention runs through ``kvbench_sdpa`` (registered with transformers' ``AttentionInterface``): SDPA
  with a bottom-right causal mask, so every attention layer may hold a different number of cached entries
  while a multi-token question is fed in one block, plus an optional per-KV-head validity mask for
  children whose heads keep different counts (padded storage).
* The parent's cache is never advanced: every answer builds a fresh cache whose attention layers point at
  the (compacted) K/V tensors and whose GDN layers are deep copies of the end-of-context snapshot, so each
  question starts from the same state.
* Decoding is the harness's own greedy loop with explicit position ids continuing from the original
  context length (``generate()`` would take positions from the pruned cache length).
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from kvbench.engines.base import (
    Answer,
    ChildSession,
    EngineBase,
    ForkStats,
    GdnSignals,
    ParentSession,
    check_context_sha,
)
from kvbench.engines.hf_adapters import HybridAdapter
from kvbench.errors import KvbenchError, ProtocolError

ATTN_IMPL = "kvbench_sdpa"


def kvbench_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA with a bottom-right causal mask and optional per-KV-head key validity.

    query ``[1, H, q, D]``; key/value ``[1, H_kv, kv, D]``. ``module.kvbench_key_mask`` (``[H_kv, S]``
    bool, True = real entry) masks padding among the first ``S`` cached entries.
    """
    sink = getattr(module, "kvbench_query_sink", None)
    if sink is not None:
        recorder, f = sink
        recorder.record_queries(f, query)
    q_len, kv_len = query.shape[2], key.shape[2]
    n_rep = query.shape[1] // key.shape[1]
    key_mask = getattr(module, "kvbench_key_mask", None)
    mask, is_causal = None, False
    if key_mask is None:
        if q_len == kv_len and q_len > 1:
            is_causal = True
        elif q_len > 1:
            mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
    else:
        valid = torch.ones(key.shape[1], kv_len, dtype=torch.bool, device=query.device)
        valid[:, : key_mask.shape[1]] = key_mask
        causal = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
        mask = (causal[None] & valid[:, None, :]).repeat_interleave(n_rep, 0)[None]  # [1, H, q, kv]
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=is_causal, scale=scaling, enable_gqa=n_rep > 1
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTN_IMPL, kvbench_sdpa)


def _storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


class TorchEngine(EngineBase):
    """Prefills contexts into parent sessions on one HF hybrid model.

    model: a ``qwen3_next`` / ``qwen3_5`` causal LM loaded with ``attn_implementation="kvbench_sdpa"``.
    """

    name = "torch"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer=None,
        *,
        stop_ids: Sequence[int] | None = None,
        fingerprint: str | None = None,
    ) -> None:
        if model.config._attn_implementation != ATTN_IMPL:
            model.set_attn_implementation(ATTN_IMPL)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self._fingerprint = fingerprint
        self.adapter = HybridAdapter(model)
        if stop_ids is None:
            stop_ids = stop_token_ids(tokenizer, model) if tokenizer is not None else ()
        self.stop_ids = tuple(stop_ids)
        text_config = model.config.get_text_config()
        self.n_heads = text_config.num_attention_heads
        self.n_kv_heads = text_config.num_key_value_heads
        self.head_dim = self.adapter.attn[0].head_dim
        self.max_context = int(text_config.max_position_embeddings)
        self._sessions: dict[str, TorchParent | TorchChild] = {}

    @property
    def fingerprint(self) -> str:
        """:func:`kvbench.models.fingerprint` of the model and tokenizer (computed once, unless given)."""
        if self._fingerprint is None:
            from kvbench.models import fingerprint

            self._fingerprint = fingerprint(self.model, self.tokenizer)
        return self._fingerprint

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _check_attention(self) -> None:
        # Padding masks and query recording live in kvbench_sdpa: never run silently without it.
        if self.model.config._attn_implementation != ATTN_IMPL:
            raise KvbenchError(
                f"the model's attention implementation was changed to {self.model.config._attn_implementation!r}; "
                f"kvbench needs {ATTN_IMPL!r} (do not share the model's config with another model)"
            )

    @torch.no_grad()
    def prefill(self, token_ids: Sequence[int], prot: int, *, query_window: int = 64) -> TorchParent:
        """Prefill ``token_ids`` once into an unpruned parent; ``prot`` leading tokens are protected.

        query_window: how many trailing context positions keep their post-RoPE queries for
        :meth:`TorchParent.queries`.
        """
        token_ids = self._context_ids(token_ids)
        n = len(token_ids)
        self._check_attention()
        ids = torch.tensor([token_ids], device=self.device)
        start = time.perf_counter()
        with self.adapter.recorder(query_window) as rec:
            out = self.model(
                input_ids=ids,
                use_cache=True,
                logits_to_keep=1,
                position_ids=torch.arange(n, device=self.device)[None],
            )
        seconds = time.perf_counter() - start
        rec.check(n)
        parent = TorchParent(
            self, self._new_id(), token_ids, prot, out.cache, rec.result(), query_window, seconds
        )
        self._sessions[parent.session_id] = parent
        return parent

    @contextmanager
    def _key_masks(self, masks: Sequence[torch.Tensor | None]) -> Iterator[None]:
        for module, mask in zip(self.adapter.attn, masks, strict=True):
            module.kvbench_key_mask = mask
        try:
            yield
        finally:
            for module in self.adapter.attn:
                module.kvbench_key_mask = None

    @staticmethod
    def _working_cache(parent: TorchParent, attn_kv: Sequence[tuple[torch.Tensor, torch.Tensor]]):
        """A fresh cache: attention layers point at ``attn_kv`` (never written in place: DynamicLayer.update
        concatenates), GDN layers are deep copies of the parent's end-of-context snapshot."""
        cache = copy.copy(parent.cache)
        cache.layers = list(parent.cache.layers)
        for f, layer_idx in enumerate(parent.attn_layer_ids):
            layer = copy.copy(parent.cache.layers[layer_idx])
            layer.keys, layer.values = attn_kv[f]
            cache.layers[layer_idx] = layer
        for layer_idx in parent.gdn_layer_ids:
            cache.layers[layer_idx] = copy.deepcopy(parent.cache.layers[layer_idx])
        return cache

    @torch.no_grad()
    def _probe(self, parent: TorchParent, token_ids: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        self._check_attention()
        if len(token_ids) == 0:
            raise KvbenchError("empty probe: nothing to feed after the context")
        cache = self._working_cache(parent, parent._full_kv())
        sink = _QuerySink(len(self.adapter.attn))
        for f, module in enumerate(self.adapter.attn):
            module.kvbench_query_sink = (sink, f)
        try:
            T = len(token_ids)
            self.model(
                input_ids=torch.tensor([list(token_ids)], device=self.device),
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
                position_ids=torch.arange(parent.n, parent.n + T, device=self.device)[None],
            )
        finally:
            for module in self.adapter.attn:
                module.kvbench_query_sink = None
        return [(sink.queries[f], cache.layers[i].keys[0, :, -T:]) for f, i in enumerate(parent.attn_layer_ids)]

    @torch.no_grad()
    def _answer(
        self,
        parent: TorchParent,
        attn_kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
        masks: Sequence[torch.Tensor | None],
        question_ids: Sequence[int],
        max_new_tokens: int,
        stop_ids: Sequence[int] | None,
        return_logits: bool,
    ) -> Answer:
        if len(question_ids) == 0:
            raise KvbenchError("empty question: nothing to feed after the context")
        self._check_attention()
        stops = set(self.stop_ids if stop_ids is None else stop_ids)
        cache = self._working_cache(parent, attn_kv)
        device = self.device
        pos = parent.n
        start = time.perf_counter()
        with self._key_masks(masks):
            q = torch.tensor([list(question_ids)], device=device)
            out = self.model(
                input_ids=q,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
                position_ids=torch.arange(pos, pos + q.shape[1], device=device)[None],
            )
            pos += q.shape[1]

            def step(token: int) -> torch.Tensor:
                nonlocal pos
                logits = self.model(
                    input_ids=torch.tensor([[token]], device=device),
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=1,
                    position_ids=torch.tensor([[pos]], device=device),
                ).logits[0, -1]
                pos += 1
                return logits

            return self.greedy(out.logits[0, -1], step, max_new_tokens, stops, return_logits, start)


class _QuerySink:
    """Receives every query an attention layer computes (``kvbench_sdpa`` calls ``record_queries``)."""

    def __init__(self, n_layers: int) -> None:
        self.queries: list[torch.Tensor | None] = [None] * n_layers

    def record_queries(self, f: int, query: torch.Tensor) -> None:
        self.queries[f] = query.detach()[0]


class TorchParent(ParentSession):
    """Unpruned parent: full attention K/V, GDN end-of-context snapshot, signals and gate statistics."""

    def __init__(
        self, engine: TorchEngine, session_id, token_ids, prot, cache, captured, query_window, seconds
    ):
        super().__init__(session_id)
        self.engine = engine
        self.cache = cache
        self._set_context(engine, token_ids, prot, engine.adapter.attn_layer_ids, engine.adapter.gdn_layer_ids, seconds)
        self._signals = GdnSignals(beta=captured["beta"], g=captured["g"], vnorm=captured["vnorm"])
        self._gate = captured["gate"]
        self._queries = captured["queries"]
        self._query_start = self.n - min(query_window, self.n)
        self._child: TorchChild | None = None

    def keys(self, f: int) -> torch.Tensor:
        self._check_live()
        return self.cache.layers[self.attn_layer_ids[f]].keys[0]

    def values(self, f: int) -> torch.Tensor:
        self._check_live()
        return self.cache.layers[self.attn_layer_ids[f]].values[0]

    def queries(self, f: int, positions: Sequence[int]) -> torch.Tensor:
        """Post-RoPE queries ``[H, P, D]``, recorded in the prefill for the last ``query_window`` positions."""
        self._check_live()
        cols = self._query_columns(positions, self._query_start)
        return self._queries[f][:, cols.to(self._queries[f].device)]

    def _full_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(self.cache.layers[i].keys, self.cache.layers[i].values) for i in self.attn_layer_ids]

    def answer(
        self, question_ids, *, max_new_tokens, context_sha256, stop_ids=None, return_logits=False
    ) -> Answer:
        self._check_live()
        check_context_sha(self.sha256, context_sha256)
        masks = [None] * self.n_attn_layers
        return self.engine._answer(
            self, self._full_kv(), masks, question_ids, max_new_tokens, stop_ids, return_logits
        )

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def model_fingerprint(self) -> str:
        return self.engine.fingerprint

    def probe(self, token_ids: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        self._check_live()
        return self.engine._probe(self, token_ids)

    @torch.no_grad()
    def fork(self, kept: Sequence[Sequence[torch.Tensor]]) -> TorchChild:
        self._check_live()
        if self._child is not None and not self._child.released:
            raise ProtocolError(
                f"parent {self.session_id} already has a live child {self._child.session_id}; release it before forking"
            )
        self.validate_kept(kept)
        start = time.perf_counter()
        device = self.engine.device
        layers, masks = [], []
        kept_entries = stored = full = 0
        padded = False
        for heads, (keys, values) in zip(kept, self._full_kv(), strict=False):  # keys/values [1, H_kv, n, D]
            counts = [len(idx) for idx in heads]
            width = max(counts)
            index = torch.zeros(self.n_kv_heads, width, dtype=torch.long, device=device)
            mask = None
            if min(counts) != width:
                padded = True
                mask = torch.zeros(self.n_kv_heads, width, dtype=torch.bool, device=device)
            for h, idx in enumerate(heads):
                index[h, : len(idx)] = idx.to(device)
                if mask is not None:
                    mask[h, : len(idx)] = True
            gather = index[None, :, :, None].expand(1, -1, -1, self.head_dim)
            child_keys = keys.gather(2, gather)
            child_values = values.gather(2, gather)
            if mask is not None:
                child_keys.masked_fill_(~mask[None, :, :, None], 0)
                child_values.masked_fill_(~mask[None, :, :, None], 0)
            layers.append((child_keys, child_values))
            masks.append(mask)
            kept_entries += sum(counts)
            stored += _storage_bytes(child_keys) + _storage_bytes(child_values)
            full += _storage_bytes(keys) + _storage_bytes(values)
        stats = ForkStats(
            kept_entries=kept_entries,
            full_entries=self.n * self.n_kv_heads * self.n_attn_layers,
            stored_bytes=stored,
            full_bytes=full,
            padded=padded,
        )
        return self._adopt(TorchChild(self, self.engine._new_id(), layers, masks, stats, time.perf_counter() - start))

    def release(self) -> None:
        if self._released:
            return
        if self._child is not None:
            self._child.release()
        self._released = True
        self.cache = None
        self._signals = self._gate = self._queries = None


class TorchChild(ChildSession):
    """Compacted child: ``layers[f] = (keys, values)`` each ``[1, H_kv, K_f, D]`` (padded when per-head
    counts differ, with ``masks[f]`` ``[H_kv, K_f]`` marking real entries)."""

    def __init__(self, parent: TorchParent, session_id, layers, masks, stats: ForkStats, fork_seconds: float):
        super().__init__(session_id, parent, stats, fork_seconds)
        self.layers = layers
        self.masks = masks

    def answer(
        self, question_ids, *, max_new_tokens, context_sha256, stop_ids=None, return_logits=False
    ) -> Answer:
        self._check_answerable(context_sha256)
        return self.parent.engine._answer(
            self.parent, self.layers, self.masks, question_ids, max_new_tokens, stop_ids, return_logits
        )

    def release(self) -> None:
        self._released = True
        self.layers = self.masks = None


def stop_token_ids(tokenizer, model) -> list[int]:
    """Token ids that end an answer: the tokenizer's eos, the generation config's eos ids, and
    ``<|im_end|>`` / ``<|endoftext|>`` where the vocabulary has them."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for t in gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]:
        if t is not None:
            ids.add(int(t))
    vocab = tokenizer.get_vocab()
    for special in ("<|im_end|>", "<|endoftext|>"):
        if special in vocab:
            ids.add(int(vocab[special]))
    return sorted(ids)
