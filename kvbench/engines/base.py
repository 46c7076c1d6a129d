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
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

import torch

from kvbench.errors import KvbenchError, ProtocolError


def context_sha256(token_ids: Sequence[int]) -> str:
    """SHA-256 of the context token ids (little-endian int64), the context's identity."""
    return hashlib.sha256(torch.tensor(list(token_ids), dtype=torch.int64).numpy().tobytes()).hexdigest()


def check_context_sha(expected: str, given: str) -> None:
    """Raise unless a question's context hash ``given`` is the session's ``expected`` one."""
    if given != expected:
        raise ProtocolError(
            f"context hash mismatch: the session holds context {expected[:12]}…, the question belongs to "
            f"{str(given)[:12]}…; prefill that context first"
        )


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def is_real_fork(child: Sequence[torch.Tensor], parent: Sequence[torch.Tensor], kept_bytes: int) -> bool:
    """Whether a child's attention K/V tensors are a real compacted copy: no child tensor's storage overlaps
    any parent tensor's, and the child's storages (each counted once) hold exactly ``kept_bytes`` (the kept
    entries' keys and values, no padding)."""
    parent_ranges = [_byte_range(t) for t in parent]
    seen: dict[int, int] = {}
    for t in child:
        lo, hi = _byte_range(t)
        if any(lo < p_hi and p_lo < hi for p_lo, p_hi in parent_ranges):
            return False
        seen[lo] = hi - lo
    return sum(seen.values()) == kept_bytes


def attention_logsumexp(
    queries: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor, scale: float, block_elems: int = 1 << 26
) -> torch.Tensor:
    """Float32 log-sum-exp of each query row's scaled attention logits over the keys it sees.

    queries ``[H, q, D]``, keys ``[H_kv, kv, D]`` (query head ``h`` reads KV head ``h // (H // H_kv)``),
    visible ``[q, kv]`` bool (True = attended). Returns ``[H, q]``: ``log sum_j exp(scale * q.k_j)`` over the
    visible ``j``, the normaliser of the softmax the attention applies. Rows are processed in blocks of
    about ``block_elems`` logits to bound memory.
    """
    H, q_len, _ = queries.shape
    H_kv, kv_len, _ = keys.shape
    k = keys.float().repeat_interleave(H // H_kv, 0)  # [H, kv, D]
    out = torch.empty(H, q_len, dtype=torch.float32, device=queries.device)
    rows = max(1, block_elems // (H * kv_len))
    for start in range(0, q_len, rows):
        logits = torch.einsum("hrd,hkd->hrk", queries[:, start : start + rows].float(), k) * scale
        logits.masked_fill_(~visible[None, start : start + rows], float("-inf"))
        out[:, start : start + rows] = logits.logsumexp(-1)
    return out


@dataclass(frozen=True)
class Answer:
    """A greedy answer. ``token_ids`` excludes the stop token. ``batch``: how many children answered in the one
    batched decode this answer came from (1: alone); ``seconds``: the wall time of that decode divided by
    ``batch`` (an answer alone: its own wall time), so the seconds of a batch's answers add up to its wall time."""

    token_ids: list[int]
    text: str
    stopped: bool
    seconds: float
    step_logits: torch.Tensor | None = None  # [steps, vocab] float32, only when asked for
    batch: int = 1


@dataclass(frozen=True)
class AnswerGroup:
    """One question for several children of one parent: what :meth:`EngineBase.answer_groups` answers.
    ``question_ids`` token ids fed after the context, ``max_new_tokens`` the answer budget, ``context_sha256`` the
    parent's context hash (the runner's check that the children answer the context it rendered)."""

    parent: ParentSession
    children: Sequence[ChildSession]
    question_ids: Sequence[int]
    max_new_tokens: int
    context_sha256: str


@dataclass(frozen=True)
class ForkStats:
    """What a fork kept and what it stores, measured on the child's tensors.

    kept_entries / full_entries: (layer, KV head, token) entries, protected prefix included.
    stored_bytes / full_bytes: bytes of the attention K and V storage of the child / parent (padding or
    page slack included). padded: the child pads heads that keep fewer entries than others.
    real_fork: derived by the engine from the child itself: its K/V storage is new (shares no memory with
    the parent's) and holds exactly the kept entries (:func:`is_real_fork`); reports exclude other rows.
    """

    kept_entries: int
    full_entries: int
    stored_bytes: int
    full_bytes: int
    padded: bool
    real_fork: bool

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


class Session(ABC):
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

    @abstractmethod
    def release(self) -> None:
        """Free the session's storage; any later use is an error."""


class ChildSession(Session):
    """A physically compacted child: per-(layer, head) kept entries, answering questions. ``stats``: what
    the fork kept and stored; ``fork_seconds``: how long the fork took."""

    def __init__(self, session_id: str, parent: "ParentSession", stats: ForkStats, fork_seconds: float) -> None:
        super().__init__(session_id)
        self.parent = parent
        self.stats = stats
        self.fork_seconds = fork_seconds

    def _check_answerable(self, context_sha256: str) -> None:
        """Both this child and its parent are live, and the caller's context hash is the parent's."""
        self._check_live()
        self.parent._check_live()
        check_context_sha(self.parent.sha256, context_sha256)

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


class EngineBase(ABC):
    """What every engine shares: the tokenizer, the registry of live sessions and input checks.

    Subclasses set ``tokenizer``, ``max_context`` and ``_sessions`` (``{}``) in ``__init__`` and implement
    :meth:`prefill`, the one entry the runner calls to start a context; their parents implement
    :meth:`ParentSession.fork` and :meth:`ParentSession.answer`, their children :meth:`ChildSession.answer`.
    The class registered in :data:`kvbench.engines.ENGINES` is constructed ``(lm, length, device)`` (the
    :class:`~kvbench.models.LoadedModel`, the longest prompt in tokens, the torch device) and declares the class
    attributes below."""

    #: the engine's ``--engine`` name (the registry checks it against the registered name)
    name: ClassVar[str] = ""
    #: False for an engine that loads the checkpoint itself: ``kvbench run`` then loads no torch copy of the
    #: weights for it (``lm.model`` on the ``meta`` device)
    torch_weights: ClassVar[bool] = True
    #: what the engine offers beyond the protocol, names of :data:`kvbench.engines.CAPABILITIES`; a method whose
    #: ``requires`` names one runs only on engines that declare it
    capabilities: ClassVar[frozenset[str]] = frozenset()
    #: the dtypes the engine runs a model in, its default first (None: whichever ``--dtype`` asks for)
    dtypes: ClassVar[tuple[str, ...] | None] = None
    #: whether :meth:`ParentSession.answer_children` answers several children in one batched decode here
    batches_children: ClassVar[bool] = False
    #: why not, in a few words (``kvbench run --answer-batch N`` with N > 1 names it in its error)
    batches_children_why: ClassVar[str] = "this engine has no batched decode"

    tokenizer: object
    max_context: int
    _sessions: dict

    @classmethod
    def decode_path(cls) -> str:
        """What this engine's decoding steps run on, in a few words, for the run manifest."""
        return "engine's own"

    @abstractmethod
    def prefill(self, token_ids: Sequence[int], prot: int, *, query_window: int = 64) -> ParentSession:
        """Prefill ``token_ids`` (``n`` context token ids) once into an unpruned parent session.

        prot: leading tokens every fork keeps; query_window: trailing context positions whose post-RoPE
        queries the parent keeps (``parent.queries``)."""

    def decode(self, token_ids: Sequence[int]) -> str:
        """Answer text: the tokenizer's decoding without special tokens (ids joined by spaces without one)."""
        if self.tokenizer is None:
            return " ".join(map(str, token_ids))
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def session(self, session_id: str) -> Session:
        """Look a live session up by id; unknown or released ids are an error."""
        session = self._sessions.get(session_id)
        if session is None:
            raise ProtocolError(f"unknown session {session_id!r}; it was never created by this engine")
        session._check_live()
        return session

    def _new_id(self) -> str:
        return uuid.uuid4().hex[:12]

    def close(self) -> None:
        """Release every live session and what the engine holds beyond its Python objects (the vLLM engine: its
        KV pool and the process's distributed state, so the next engine can start in this process). Idempotent;
        the engine is not used after it. The runner closes each model's engine before the next model loads."""
        for session in list(self._sessions.values()):
            if not session.released:
                session.release()

    def answer_groups(self, groups: Sequence[AnswerGroup], stop_ids: Sequence[int] | None = None) -> list[list[Answer]]:
        """The answers of every group (per group, its children's, in their order), each what ``child.answer``
        returns. The groups may belong to different parents (contexts) and questions. This base implementation
        answers each group with its parent's :meth:`ParentSession.answer_children`; an engine with a batched decode
        overrides it to decode every group's children together (the same tokens)."""
        return [
            group.parent.answer_children(
                group.children,
                group.question_ids,
                max_new_tokens=group.max_new_tokens,
                context_sha256=group.context_sha256,
                stop_ids=stop_ids,
            )
            for group in groups
        ]

    def greedy(
        self,
        first_logits: torch.Tensor,
        step: Callable[[int], torch.Tensor],
        max_new_tokens: int,
        stops: set[int],
        return_logits: bool,
        start: float,
    ) -> Answer:
        """The harness's greedy loop, shared by the engines. ``first_logits`` ``[vocab]``: the logits after the
        question; ``step(token)`` feeds one token and returns the next logits. Stops at a stop id (not
        included) or after ``max_new_tokens``; ``start`` is the ``perf_counter`` time the answer began."""
        logits, generated, stopped = first_logits, [], False
        log: list[torch.Tensor] = []
        for i in range(max_new_tokens):
            if return_logits:
                log.append(logits.float().cpu())
            token = int(logits.argmax())
            if token in stops:
                stopped = True
                break
            generated.append(token)
            if i == max_new_tokens - 1:
                break
            logits = step(token)
        return Answer(
            token_ids=generated,
            text=self.decode(generated),
            stopped=stopped,
            seconds=time.perf_counter() - start,
            step_logits=torch.stack(log) if return_logits and log else None,
        )

    def _context_ids(self, token_ids: Sequence[int]) -> list[int]:
        """``token_ids`` as ints, refused when empty or longer than ``max_context``."""
        token_ids = [int(t) for t in token_ids]
        if not token_ids:
            raise KvbenchError("empty context: the bench produced no context tokens")
        if len(token_ids) > self.max_context:
            raise KvbenchError(
                f"context of {len(token_ids)} tokens exceeds the model limit of {self.max_context}; "
                "middle-truncate it first (the runner does this automatically)"
            )
        return token_ids


class ParentSession(Session):
    """The unpruned prefilled context, read by methods and forked by the runner.

    ``max_live_children``: how many children may be live at once (None: as many as memory holds); an engine that
    answers several children in one batched decode (:meth:`answer_children`) allows more than one."""

    max_live_children: int | None = 1

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

    def signals(self) -> GdnSignals:
        """GDN signals captured during the prefill (engines store them in ``_signals``)."""
        self._check_live()
        return self._signals

    def gate(self, f: int) -> torch.Tensor:
        """Attention output gate ``sigmoid(gate)`` averaged over the head dim, ``[n, H]`` (engines store one
        per layer ordinal in ``_gate``)."""
        self._check_live()
        return self._gate[f]

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
    def probe(self, token_ids: Sequence[int]) -> list[tuple[torch.Tensor, ...]]:
        """Feed ``token_ids`` after the full context on a throwaway cache (GDN states restored to the end
        of the context, positions ``n, n+1, …``); the parent is not changed. Returns, per attention layer
        ordinal, the probe tokens' post-RoPE queries ``[H, T, D]`` and keys ``[H_kv, T, D]``, and where the
        engine's attention kernel gives it, a third element: the float32 log-sum-exp ``[H, T]`` of each probe
        row's scaled logits over the context and the probe keys ``0..t`` (:func:`attention_logsumexp` of the
        same inputs). Used by methods that run an extra pass (KVzip's reconstruction)."""

    def _set_context(self, engine, token_ids: list[int], prot: int, attn_layer_ids, gdn_layer_ids, seconds: float):
        """The fields every parent holds: the context, its hash and protected prefix, the layer layout and
        head sizes (from ``engine``), and the prefill time."""
        self.token_ids = token_ids
        self.sha256 = context_sha256(token_ids)
        self.n = len(token_ids)
        if not 0 <= prot <= self.n:
            raise KvbenchError(f"protected prefix {prot} is outside [0, {self.n}]")
        self.prot = prot
        self.attn_layer_ids = list(attn_layer_ids)
        self.gdn_layer_ids = list(gdn_layer_ids)
        self.n_heads, self.n_kv_heads, self.head_dim = engine.n_heads, engine.n_kv_heads, engine.head_dim
        self.prefill_seconds = seconds

    def _query_columns(self, positions: Sequence[int], first: int) -> torch.Tensor:
        """Columns of ``positions`` in queries recorded for context positions ``first .. n-1``."""
        pos = torch.as_tensor(list(positions), dtype=torch.long)
        if len(pos) and (int(pos.min()) < first or int(pos.max()) >= self.n):
            raise KvbenchError(
                f"queries were kept for positions {first}..{self.n - 1} only; prefill with a larger "
                "query_window (a method declares it with its `query_window` attribute)"
            )
        return pos - first

    def validate_kept(self, kept: Sequence[Sequence[torch.Tensor]]) -> None:
        """Raise unless ``kept[f][h]`` is, for every layer ordinal and KV head, a sorted duplicate-free 1-D
        LongTensor of context positions."""
        if len(kept) != self.n_attn_layers:
            raise KvbenchError(f"kept has {len(kept)} layers, the model has {self.n_attn_layers} attention layers")
        for f, heads in enumerate(kept):
            if len(heads) != self.n_kv_heads:
                raise KvbenchError(f"kept[{f}] has {len(heads)} heads, the model has {self.n_kv_heads} KV heads")
            for h, idx in enumerate(heads):
                if idx.dim() != 1 or idx.dtype != torch.long:
                    raise KvbenchError(f"kept[{f}][{h}] must be a 1-D LongTensor of positions")
                if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= self.n):
                    raise KvbenchError(f"kept[{f}][{h}] has positions outside [0, {self.n})")
                if len(idx) > 1 and not bool((idx[1:] > idx[:-1]).all()):
                    raise KvbenchError(f"kept[{f}][{h}] must be sorted and free of duplicates")

    def live_children(self) -> list[ChildSession]:
        """This parent's children that are not released yet, oldest first."""
        return [c for c in getattr(self, "_children", []) if not c.released]

    def _check_can_fork(self) -> None:
        """Raise when this parent already has ``max_live_children`` live children."""
        live = self.live_children()
        if self.max_live_children is not None and len(live) >= self.max_live_children:
            ids = ", ".join(c.session_id for c in live)
            raise ProtocolError(
                f"parent {self.session_id} already has {len(live)} live child(ren) ({ids}), the most this engine holds "
                f"at once ({self.max_live_children}); release one before forking"
            )

    def _adopt(self, child: ChildSession) -> ChildSession:
        """Make ``child`` one of this parent's live children and register it with the engine (``self.engine``)."""
        self._children = self.live_children() + [child]
        self.engine._sessions[child.session_id] = child
        return child

    def answer_children(
        self,
        children: Sequence[ChildSession],
        question_ids: Sequence[int],
        *,
        max_new_tokens: int,
        context_sha256: str,
        stop_ids: Sequence[int] | None = None,
    ) -> list[Answer]:
        """The answers of ``children`` (live children of this parent) to one question, in their order, each what
        ``child.answer`` returns. This base implementation answers them one at a time; an engine with a batched
        decode overrides it (one forward per decoding step for all of them, the same tokens)."""
        return [
            child.answer(question_ids, max_new_tokens=max_new_tokens, context_sha256=context_sha256, stop_ids=stop_ids)
            for child in children
        ]

    def answer_batch_limit(self, question_tokens: int, max_new_tokens: int, *, forked: bool = False) -> int:
        """How many children :meth:`answer_children` should take at once for a question of ``question_tokens``
        tokens and an answer of up to ``max_new_tokens`` (an estimate of what fits in memory; at most
        ``max_live_children``); ``forked``: the children already exist (their storage is no longer free memory),
        count only what answering adds. The base: one."""
        return 1

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
