"""The engine contract: parent sessions, forks and answers (DESIGN.md, "The protocol").

Methods only ever see a :class:`ParentSession` (read-only views of the prefilled context); the runner
drives :meth:`ParentSession.fork` and :meth:`ChildSession.answer`. Every engine implements these two
classes and passes the engine-conformance suite (``tests/test_conformance.py``).

Shapes use ``n`` context tokens, ``H`` query heads, ``H_kv`` KV heads, ``D`` head dim, ``Hv`` GDN value
heads. Attention layers are addressed by their *ordinal* ``f = 0 .. L_attn-1`` (not the global layer
index, which is ``attn_layer_ids[f]``); GDN layers by ordinal into ``gdn_layer_ids``.
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from dataclasses import dataclass
from typing import Sequence

import torch

from kvbench.errors import ProtocolError


def context_sha256(token_ids: Sequence[int]) -> str:
    """SHA-256 of the context token ids (little-endian int64), the context's identity."""
    return hashlib.sha256(torch.tensor(list(token_ids), dtype=torch.int64).numpy().tobytes()).hexdigest()


@dataclass(frozen=True)
class Answer:
    """A greedy answer. ``token_ids`` excludes the stop token; ``seconds`` is wall time."""

    token_ids: list[int]
    text: str
    stopped: bool
    seconds: float
    step_logits: torch.Tensor | None = None  # [steps, vocab] float32, only when asked for


@dataclass(frozen=True)
class ForkStats:
    """What a fork kept and what it stores, measured on the child's tensors.

    kept_entries / full_entries: (layer, KV head, token) entries, protected prefix included.
    stored_bytes / full_bytes: bytes of the attention K and V storage of the child / parent
    (padding included when per-head counts differ within a layer).
    """

    kept_entries: int
    full_entries: int
    stored_bytes: int
    full_bytes: int
    padded: bool

    @property
    def freed_bytes(self) -> int:
        return self.full_bytes - self.stored_bytes


@dataclass(frozen=True)
class GdnSignals:
    """Native GDN signals of every context token, one tensor per GDN layer ordinal, each ``[n, Hv]``.

    beta: write gate in (0, 1). g: log decay (<= 0). vnorm: L2 norm of the written value vector (after the
    short conv and activation).
    """

    beta: list[torch.Tensor]
    g: list[torch.Tensor]
    vnorm: list[torch.Tensor]


class Session:
    """Common lifecycle: a session is live until released; any use after that is an error."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._released = False

    def _check_live(self) -> None:
        if self._released:
            raise ProtocolError(f"session {self.session_id} was released; prefill or fork a new one")

    @property
    def released(self) -> bool:
        return self._released


class ChildSession(Session):
    """A physically compacted child: per-(layer, head) kept entries, answering questions."""

    stats: ForkStats

    @abstractmethod
    def answer(
        self,
        question_ids: Sequence[int],
        *,
        max_new_tokens: int,
        context_sha256: str,
        stop_ids: Sequence[int] | None = None,
        return_logits: bool = False,
    ) -> Answer:
        """Answer from the compacted cache with the GDN states restored to the end of the context and
        positions continuing from the original length ``n``. ``context_sha256`` must match the parent's."""

    @abstractmethod
    def release(self) -> None:
        """Free the child's storage; the parent can fork again."""


class ParentSession(Session):
    """The unpruned prefilled context, read by methods and forked by the runner."""

    token_ids: list[int]
    sha256: str
    n: int
    prot: int
    attn_layer_ids: list[int]
    gdn_layer_ids: list[int]
    n_heads: int
    n_kv_heads: int
    head_dim: int
    prefill_seconds: float

    @property
    def n_attn_layers(self) -> int:
        return len(self.attn_layer_ids)

    @abstractmethod
    def keys(self, f: int) -> torch.Tensor:
        """Post-RoPE keys ``[H_kv, n, D]`` of attention layer ordinal ``f`` (read-only)."""

    @abstractmethod
    def values(self, f: int) -> torch.Tensor:
        """Values ``[H_kv, n, D]`` of attention layer ordinal ``f`` (read-only)."""

    @abstractmethod
    def queries(self, f: int, positions: Sequence[int]) -> torch.Tensor:
        """Post-RoPE queries ``[H, len(positions), D]`` of attention layer ``f`` at context positions
        (the model's own q projection, q/gate split, q_norm and RoPE)."""

    @abstractmethod
    def signals(self) -> GdnSignals:
        """GDN signals captured during the prefill."""

    @abstractmethod
    def gate(self, f: int) -> torch.Tensor:
        """Attention output gate ``sigmoid(gate)`` averaged over the head dim, ``[n, H]``."""

    def gate_means(self) -> list[float]:
        """Per attention layer: mean over tokens and head dim of the output gate, max over the query
        heads of each KV head, then mean over KV heads (the ``gate`` allocation's ``w_l``)."""
        out = []
        for f in range(self.n_attn_layers):
            per_head = self.gate(f).float().mean(0)  # [H]
            out.append(per_head.view(self.n_kv_heads, -1).max(1).values.mean().item())
        return out

    @property
    def tokenizer(self):
        """The model's tokenizer (for methods that build extra prompts), or None."""
        return None

    @property
    def model_fingerprint(self) -> str | None:
        """The model's :func:`kvbench.models.fingerprint`, for methods whose offline artifacts must match
        the model; None when the engine does not know it."""
        return None

    @abstractmethod
    def probe(self, token_ids: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Feed ``token_ids`` after the full context on a throwaway cache (GDN states restored to the end
        of the context, positions ``n, n+1, …``); the parent is not changed. Returns, per attention layer
        ordinal, the probe tokens' post-RoPE queries ``[H, T, D]`` and keys ``[H_kv, T, D]``. Used by
        methods that run an extra pass (KVzip's reconstruction)."""

    @abstractmethod
    def fork(self, kept: Sequence[Sequence[torch.Tensor]]) -> ChildSession:
        """Child keeping ``kept[f][h]`` (sorted context positions) for every layer ordinal and KV head.
        Only one child may be live at a time."""

    @abstractmethod
    def answer(
        self,
        question_ids: Sequence[int],
        *,
        max_new_tokens: int,
        context_sha256: str,
        stop_ids: Sequence[int] | None = None,
        return_logits: bool = False,
    ) -> Answer:
        """Unpruned reference answer, the same way a child answers (context, then question)."""

    @abstractmethod
    def release(self) -> None:
        """Free the parent (and its live child, if any)."""
