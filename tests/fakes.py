"""Stand-ins: a tensors-only ParentSession for method unit tests, and a torch engine that only masks."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from kvbench.engines.base import ChildSession, EngineBase, ParentSession
from kvbench.engines.torch_engine import TorchEngine, TorchParent


@dataclass
class FakeParent:
    """keys ``[H_kv, n, D]`` per attention layer; optional queries ``[H, n, D]`` per layer (all positions)."""

    key_list: list[torch.Tensor]
    query_list: list[torch.Tensor] | None = None
    n_heads: int | None = None
    prot: int = 0

    def __post_init__(self) -> None:
        if self.n_heads is None:
            self.n_heads = self.query_list[0].shape[0] if self.query_list else self.n_kv_heads

    @property
    def n(self) -> int:
        return self.key_list[0].shape[1]

    @property
    def n_attn_layers(self) -> int:
        return len(self.key_list)

    @property
    def n_kv_heads(self) -> int:
        return self.key_list[0].shape[0]

    @property
    def head_dim(self) -> int:
        return self.key_list[0].shape[2]

    def keys(self, f: int) -> torch.Tensor:
        return self.key_list[f]

    def queries(self, f: int, positions) -> torch.Tensor:
        return self.query_list[f][:, list(positions)]


class MaskingTorchEngine(TorchEngine):
    """A torch engine that only masks: a fork keeps the parent's full K/V (no new storage) and the eviction
    is applied only while answering, which is what masking evicted entries does. Answers equal a real
    fork's, but the child frees nothing, so its stats (measured by the engine's own ``_fork_stats`` on the
    tensors the child holds) say ``real_fork`` false."""

    def prefill(self, token_ids, prot, *, query_window=64):
        parent = super().prefill(token_ids, prot, query_window=query_window)
        parent.__class__ = _MaskingParent
        return parent

    # several contexts' children answer through each parent's answer_children below, not one merged decode
    answer_groups = EngineBase.answer_groups


class _MaskingParent(TorchParent):
    # its children hold masks, not compacted layers: they answer one at a time (the engine contract's base)
    answer_children = ParentSession.answer_children

    def fork(self, kept):
        self._check_live()
        self.validate_kept(kept)
        start = time.perf_counter()
        stats = self._fork_stats(kept, self._full_kv())
        return self._adopt(_MaskingChild(self, self.engine._new_id(), kept, stats, time.perf_counter() - start))


class _MaskingChild(ChildSession):
    def __init__(self, parent, session_id, kept, stats, fork_seconds):
        super().__init__(session_id, parent, stats, fork_seconds)
        self.kept = kept

    def answer(self, question_ids, *, max_new_tokens, context_sha256, stop_ids=None, return_logits=False):
        self._check_answerable(context_sha256)
        parent = self.parent
        layers = [parent._compact(heads, k, v) for heads, (k, v) in zip(self.kept, parent._full_kv(), strict=True)]
        return parent.engine._answer(parent, layers, question_ids, max_new_tokens, stop_ids, return_logits)

    def release(self) -> None:
        self._released = True
        self.kept = None
