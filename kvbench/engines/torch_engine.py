"""The reference engine: HF transformers hybrids in PyTorch (CPU or GPU).

* Attention runs through ``kvbench_sdpa`` (:mod:`kvbench.engines.attention`, registered when an engine is
  made): SDPA with a bottom-right causal mask, so every attention layer may hold a different number of
  cached entries while a multi-token question is fed in one block. A child layer whose KV heads keep
  different counts is stored ragged, without padding (:class:`RaggedKV`: one packed buffer, per-head
  offsets), and attended with one SDPA call per KV head.
* The parent's cache is never advanced: every answer builds a fresh cache whose attention layers copy the
  (compacted) K/V tensors once into buffers with room for the fed tokens and whose GDN layers are deep copies of
  the end-of-context snapshot, so each question starts from the same state and no child is written.
* Decoding is the harness's own greedy loop with explicit position ids continuing from the original
  context length (``generate()`` would take positions from the pruned cache length).
* A parent may hold several live children, and :meth:`TorchParent.answer_children` answers one question from
  all of them in one batched greedy loop (one forward per decoding step): each child's attention entries sit in
  a :class:`~kvbench.engines.batch_kv.BatchKV` (per layer, buckets of similar kept counts, padding masked), the
  GDN / convolution states are the parent's snapshot repeated per row (the layers before the first attention
  layer: one row per group of rows fed the same tokens, :class:`_SharedRows`), and a child whose answer ends
  leaves the batch. One child alone takes the one-at-a-time path.
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from transformers.cache_utils import DynamicLayer

from kvbench.engines.attention import ATTN_IMPL, RaggedKV, register_attention
from kvbench.engines.base import (
    Answer,
    AnswerGroup,
    ChildSession,
    EngineBase,
    ForkStats,
    GdnSignals,
    ParentSession,
    check_context_sha,
    is_real_fork,
)
from kvbench.engines.batch_kv import Arena, BatchKV
from kvbench.engines.hf_adapters import HybridAdapter
from kvbench.errors import KvbenchError, ProtocolError
from kvbench.models import LoadedModel
from kvbench.models import fingerprint as model_fingerprint

#: The share of the memory free when a batch starts that :meth:`TorchParent.answer_batch_limit` plans to use.
BATCH_MEMORY_SHARE = 0.25


def _storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def free_memory_bytes(device: torch.device) -> int:
    """Bytes free for new tensors on ``device``: CUDA's free memory, else the host's ``MemAvailable``."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30  # no /proc/meminfo (not Linux): assume 4 GiB


def _head_entries(layer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A child layer's kept ``(keys [K_h, D], values [K_h, D])`` per KV head (dense or :class:`RaggedKV`)."""
    if isinstance(layer, RaggedKV):
        return [(layer.head_keys(h), layer.head_values(h)) for h in range(len(layer.counts))]
    keys, values = layer
    return [(keys[0, h], values[0, h]) for h in range(keys.shape[1])]


class TorchEngine(EngineBase):
    """Prefills contexts into parent sessions on one HF hybrid model.

    model: a ``qwen3_next`` / ``qwen3_5`` causal LM loaded with ``attn_implementation="kvbench_sdpa"``.
    """

    name = "torch"
    batches_children = True
    capabilities = frozenset({"model_weights", "ragged_heads"})

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer=None,
        *,
        stop_ids: Sequence[int] | None = None,
        fingerprint: str | None = None,
    ) -> None:
        register_attention()  # before the model can switch to it (idempotent)
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
        self._arena = Arena()  # bucket buffers of batched answers on CPU (kept between answers: see Arena)

    @property
    def fingerprint(self) -> str:
        """:func:`kvbench.models.fingerprint` of the model and tokenizer (computed once, unless given)."""
        if self._fingerprint is None:
            self._fingerprint = model_fingerprint(self.model, self.tokenizer)
        return self._fingerprint

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _check_attention(self) -> None:
        # Ragged per-head attention and query recording live in kvbench_sdpa: never run silently without it.
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
        parent = TorchParent(self, self._new_id(), token_ids, prot, out.cache, rec.result(), query_window, seconds)
        self._sessions[parent.session_id] = parent
        return parent

    @contextmanager
    def _ragged_layers(self, attn_kv: Sequence) -> Iterator[None]:
        """Point every attention module at its layer's :class:`RaggedKV` (None for dense layers)."""
        for module, kv in zip(self.adapter.attn, attn_kv, strict=True):
            module.kvbench_ragged = kv if isinstance(kv, RaggedKV) else None
        try:
            yield
        finally:
            for module in self.adapter.attn:
                module.kvbench_ragged = None

    @contextmanager
    def _batched_layers(self, batch: Sequence[BatchKV]) -> Iterator[None]:
        """Point every attention module at its layer's :class:`BatchKV` for a batched answer."""
        for module, kv in zip(self.adapter.attn, batch, strict=True):
            module.kvbench_batch = kv
        try:
            yield
        finally:
            for module in self.adapter.attn:
                module.kvbench_batch = None

    def _batch_cache(self, parent: TorchParent, rows: int):
        """A fresh cache for ``rows`` children answering together: attention layers pass what is fed through to
        the batch's :class:`BatchKV` (which stores it), GDN layers hold ``rows`` copies of the parent's
        end-of-context conv and recurrent states (batch dimension first), except the leading ones (before the
        first attention layer), which hold one: every row feeds them the same question (:class:`_SharedRows`)."""
        cache = copy.copy(parent.cache)
        cache.layers = list(parent.cache.layers)
        for layer_idx in parent.attn_layer_ids:
            cache.layers[layer_idx] = _FedEntriesLayer()
        leading = set(self.adapter.leading_gdn_layer_ids)
        for layer_idx in parent.gdn_layer_ids:
            layer = copy.copy(parent.cache.layers[layer_idx])
            for name, value in vars(layer).items():  # per-state dicts: the copy's own, the parent's stay as they are
                if isinstance(value, dict):
                    setattr(layer, name, dict(value))
            layer.reorder_cache(torch.zeros(1 if layer_idx in leading else rows, dtype=torch.long))  # new tensors
            cache.layers[layer_idx] = layer
        return cache

    @staticmethod
    def _working_cache(parent: TorchParent, attn_kv: Sequence, room: int):
        """A fresh cache for feeding up to ``room`` tokens after the context: each attention layer a
        :class:`_RoomLayer` holding a copy of ``attn_kv``'s entries (``attn_kv`` itself is never written) with room
        after them; GDN layers are deep copies of the parent's end-of-context snapshot. A ragged layer's cache
        only passes what is fed on (:class:`_FedEntriesLayer`): ``kvbench_sdpa`` appends it to the layer's
        :class:`RaggedKV` (a copy with room, :meth:`RaggedKV.with_room`), which holds the kept entries per head."""
        cache = copy.copy(parent.cache)
        cache.layers = list(parent.cache.layers)
        for f, layer_idx in enumerate(parent.attn_layer_ids):
            kv = attn_kv[f]
            cache.layers[layer_idx] = _FedEntriesLayer() if isinstance(kv, RaggedKV) else _RoomLayer(*kv, room)
        for layer_idx in parent.gdn_layer_ids:
            cache.layers[layer_idx] = copy.deepcopy(parent.cache.layers[layer_idx])
        return cache

    @torch.no_grad()
    def _probe(
        self, parent: TorchParent, token_ids: Sequence[int]
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        self._check_attention()
        if len(token_ids) == 0:
            raise KvbenchError("empty probe: nothing to feed after the context")
        cache = self._working_cache(parent, parent._full_kv(), len(token_ids))
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
        return [
            (sink.queries[f], cache.layers[i].keys[0, :, -T:], sink.lse[f]) for f, i in enumerate(parent.attn_layer_ids)
        ]

    @torch.no_grad()
    def _answer(
        self,
        parent: TorchParent,
        attn_kv: Sequence,
        question_ids: Sequence[int],
        max_new_tokens: int,
        stop_ids: Sequence[int] | None,
        return_logits: bool,
    ) -> Answer:
        if len(question_ids) == 0:
            raise KvbenchError("empty question: nothing to feed after the context")
        self._check_attention()
        stops = set(self.stop_ids if stop_ids is None else stop_ids)
        start = time.perf_counter()
        room = len(question_ids) + max_new_tokens  # entries fed after the context, at most
        attn_kv = [kv.with_room(room) if isinstance(kv, RaggedKV) else kv for kv in attn_kv]
        cache = self._working_cache(parent, attn_kv, room)
        device = self.device
        pos = parent.n
        with self._ragged_layers(attn_kv), self.adapter.decode_kernels():
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

    def close(self) -> None:
        """Release every live session and the arena's buffers."""
        super().close()
        self._arena = Arena()

    def answer_groups(
        self, groups: Sequence[AnswerGroup], stop_ids: Sequence[int] | None = None, *, return_logits: bool = False
    ) -> list[list[Answer]]:
        """Every group's children answer in one batched greedy loop (:meth:`_answer_groups`): groups of different
        parents (contexts) and questions decode together, which keeps the batch full when each group's tail is a
        few long answers. One child in all: the one-at-a-time path. ``return_logits``: each answer carries its
        ``step_logits`` (``[steps, vocab]`` float32, as :meth:`TorchChild.answer` gives them; for tests)."""
        for group in groups:
            if getattr(group.parent, "engine", None) is not self:
                raise ProtocolError(f"parent {group.parent.session_id} is not a session of this engine")
        if sum(len(g.children) for g in groups) == 1 or len(groups) == 1:  # each parent's own answer_children
            return [
                g.parent.answer_children(g.children, g.question_ids, max_new_tokens=g.max_new_tokens,
                                         context_sha256=g.context_sha256, stop_ids=stop_ids,
                                         return_logits=return_logits)
                for g in groups
            ]  # fmt: skip
        for group in groups:
            group.parent._check_children(group.children, group.context_sha256)
        lanes = [_Lane(g.parent, [c.layers for c in g.children], g.question_ids, g.max_new_tokens) for g in groups]
        return self._answer_groups(lanes, stop_ids, return_logits)

    def _question_block(self, lane: _Lane) -> _Block:
        """Feed ``lane``'s question to all its children at once (one forward): their batch (per attention layer a
        :class:`BatchKV`, rows widest child first), a cache holding the GDN states after the question, and the
        next-token logits ``[rows, vocab]``."""
        if len(lane.question_ids) == 0:
            raise KvbenchError("empty question: nothing to feed after the context")
        parent, size, T = lane.parent, len(lane.children_kv), len(lane.question_ids)
        entries = [[_head_entries(layer) for layer in layers] for layers in lane.children_kv]  # [child][f][h]: (K, V)
        kept = [sum(len(k) for heads in child for k, _ in heads) for child in entries]
        order = sorted(range(size), key=lambda i: -kept[i])  # batch row -> child
        extra = T + lane.max_new_tokens
        arena = self._arena if self.device.type == "cpu" else None  # elsewhere the caching allocator keeps memory
        batch = [BatchKV([entries[i][f] for i in order], extra, arena) for f in range(parent.n_attn_layers)]
        cache = self._batch_cache(parent, size)
        ids = torch.tensor([list(lane.question_ids)] * size, device=self.device)
        positions = torch.arange(parent.n, parent.n + T, device=self.device)[None].expand(size, -1)
        shared = self._shared_rows([0] * size)  # one group: every row has fed the same tokens
        with self._batched_layers(batch), shared:
            out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1, position_ids=positions)
        return _Block(batch, cache, order, out.logits[:, -1], parent.n + T)

    def _shared_rows(self, groups: Sequence[int]) -> _SharedRows:
        """The leading layers' sharing for one forward: batch row ``r`` reads group ``groups[r]``'s output."""
        layers = [self.adapter.decoder_layers[i] for i in self.adapter.leading_gdn_layer_ids]
        return _SharedRows(layers, groups, self.device)

    def _merge_caches(self, blocks: Sequence[_Block], gdn_layer_ids: Sequence[int]):
        """One cache over the rows of every block, in order: each GDN layer's conv and recurrent states
        concatenated along the batch (the blocks' attention layers only pass fed entries on to the batch)."""
        if len(blocks) == 1:
            return blocks[0].cache
        cache = copy.copy(blocks[0].cache)
        cache.layers = list(cache.layers)
        for layer_idx in gdn_layer_ids:
            layers = [b.cache.layers[layer_idx] for b in blocks]
            merged = copy.copy(layers[0])
            for name, value in vars(layers[0]).items():
                if isinstance(value, dict) and value and all(isinstance(t, torch.Tensor) for t in value.values()):
                    setattr(merged, name, {k: torch.cat([vars(lay)[name][k] for lay in layers]) for k in value})
            cache.layers[layer_idx] = merged
        return cache

    @torch.no_grad()
    def _answer_groups(
        self, lanes: Sequence[_Lane], stop_ids: Sequence[int] | None, return_logits: bool = False
    ) -> list[list[Answer]]:
        """The greedy answers of several lanes (a lane: children of one parent and one question; lanes may differ
        in parent, question and budget) in one batched loop: each lane's question is fed in its own forward
        (:meth:`_question_block`), then every lane's rows decode together, one forward per step, each row at its own
        position; the same stopping rule as :meth:`EngineBase.greedy`, row by row (a row's budget is its lane's);
        a row whose answer ended leaves the batch. Returns per lane its children's answers, in their order (with
        their ``step_logits`` when ``return_logits``)."""
        self._check_attention()
        stops = set(self.stop_ids if stop_ids is None else stop_ids)
        start = time.perf_counter()
        self._arena.reset()  # no batch of an earlier answer is in use any more
        with self.adapter.decode_kernels():
            return self._decode_lanes(lanes, stops, start, return_logits)

    def _decode_lanes(
        self, lanes: Sequence[_Lane], stops: set[int], start: float, return_logits: bool = False
    ) -> list[list[Answer]]:
        """:meth:`_answer_groups`'s loop (it holds the decode kernels around it)."""
        device = self.device
        blocks = [self._question_block(lane) for lane in lanes]
        batch = [BatchKV.concat([b.batch[f] for b in blocks]) for f in range(len(blocks[0].batch))]
        cache = self._merge_caches(blocks, lanes[0].parent.gdn_layer_ids)
        rows = [(k, i) for k, b in enumerate(blocks) for i in b.order]  # batch row -> (lane, child)
        budget = [lanes[k].max_new_tokens for k, _ in rows]
        next_pos = torch.tensor([blocks[k].next_position for k, _ in rows], device=device)
        logits = torch.cat([b.logits for b in blocks]) if len(blocks) > 1 else blocks[0].logits
        generated = [[[] for _ in lane.children_kv] for lane in lanes]
        stopped = [[False] * len(lane.children_kv) for lane in lanes]
        log: list[list[list[torch.Tensor]]] = [[[] for _ in lane.children_kv] for lane in lanes]  # return_logits
        leading = self.adapter.leading_gdn_layer_ids
        groups = [k for k, _ in rows]  # batch row -> its row of the leading GDN layers (one per lane so far)
        n_groups = len(lanes)
        with self._batched_layers(batch):
            for i in range(max(budget)):
                if return_logits:  # each row's logits before its token is picked, as the one-at-a-time loop logs
                    for r, row_logits in enumerate(logits.float().cpu()):
                        log[rows[r][0]][rows[r][1]].append(row_logits)
                tokens = logits.argmax(-1).tolist()
                live = []
                for r, token in enumerate(tokens):
                    k, c = rows[r]
                    if token in stops:
                        stopped[k][c] = True
                        continue
                    generated[k][c].append(token)
                    if i < budget[r] - 1:
                        live.append(r)
                if not live:
                    break
                if len(live) < len(rows):  # finished children leave the batch
                    keep = torch.tensor(live, device=device)
                    for kv in batch:
                        kv.select(keep)
                    for layer_idx in lanes[0].parent.gdn_layer_ids:
                        if layer_idx not in leading:
                            cache.layers[layer_idx].reorder_cache(keep)
                    rows, budget, next_pos = [rows[r] for r in live], [budget[r] for r in live], next_pos[keep]
                    tokens, groups = [tokens[r] for r in live], [groups[r] for r in live]
                source, groups = share_groups(groups, tokens)
                if source != list(range(n_groups)):  # each group's states, from the group it split from
                    for layer_idx in leading:
                        cache.layers[layer_idx].reorder_cache(torch.tensor(source, device=device))
                n_groups, shared = len(source), self._shared_rows(groups)
                ids = torch.tensor(tokens, device=device)[:, None]
                with shared:
                    out = self.model(
                        input_ids=ids,
                        cache=cache,
                        use_cache=True,
                        logits_to_keep=1,
                        position_ids=(next_pos + i)[:, None],
                    )
                logits = out.logits[:, -1]
        size = sum(len(lane.children_kv) for lane in lanes)
        seconds = (time.perf_counter() - start) / size
        return [
            [
                Answer(token_ids=ids, text=self.decode(ids), stopped=stop, seconds=seconds, batch=size,
                       step_logits=torch.stack(steps) if return_logits else None)
                for ids, stop, steps in zip(lane_ids, lane_stopped, lane_log, strict=True)
            ]
            for lane_ids, lane_stopped, lane_log in zip(generated, stopped, log, strict=True)
        ]  # fmt: skip


@dataclass(frozen=True)
class _Lane:
    """Children of one parent answering one question together: ``children_kv[i]`` child ``i``'s compacted layers."""

    parent: TorchParent
    children_kv: Sequence[Sequence]
    question_ids: Sequence[int]
    max_new_tokens: int


@dataclass(frozen=True)
class _Block:
    """A lane after its question: ``batch`` its rows' entries per attention layer, ``cache`` their GDN states,
    ``order`` batch row -> child index, ``logits`` ``[rows, vocab]`` the first answer token's, ``next_position``
    the position of the first answer token."""

    batch: list[BatchKV]
    cache: object
    order: list[int]
    logits: torch.Tensor
    next_position: int


def share_groups(groups: Sequence[int], tokens: Sequence[int]) -> tuple[list[int], list[int]]:
    """Rows that have been fed the same tokens since their parent's context (same lane, same answer so far) share
    one row of the leading GDN layers. Row ``r`` was in group ``groups[r]`` and is now fed ``tokens[r]``; rows of one
    group fed the same token stay together, the others split off. Returns ``(source, new_groups)``: ``source[g]``
    the old group new group ``g`` comes from (new groups numbered in order of first row), ``new_groups[r]`` row
    ``r``'s new group. E.g. groups ``[0, 0, 0, 1]``, tokens ``[5, 7, 5, 5]`` -> ``([0, 0, 1], [0, 1, 0, 2])``."""
    index: dict[tuple[int, int], int] = {}
    source, new_groups = [], []
    for g, token in zip(groups, tokens, strict=True):
        if (g, token) not in index:
            index[(g, token)] = len(source)
            source.append(g)
        new_groups.append(index[(g, token)])
    return source, new_groups


class _SharedRows:
    """One batched forward's sharing of the decoder layers before the first attention layer (``layers``: GDN token
    mixers and their MLPs, whose output for a row depends only on what was fed to it since the context). They run
    once per group of rows fed the same tokens: the first one's input is cut to one row per group (its first
    row; the leading GDN layers' cache holds one state per group), the last one's output is spread back to every
    row (``groups[r]``: row ``r``'s group, groups numbered 0 .. G-1). Use as a context manager around the
    forward. The hooks take the decoder layer's call as transformers 5.24 makes it (hidden states first and
    positional, a tensor returned)."""

    def __init__(self, layers: Sequence[torch.nn.Module], groups: Sequence[int], device: torch.device) -> None:
        self.layers = list(layers)
        firsts: dict[int, int] = {}
        for r, g in enumerate(groups):
            firsts.setdefault(g, r)
        self.row_group = torch.tensor(groups, dtype=torch.long, device=device)
        self.first_rows = torch.tensor([firsts[g] for g in range(len(firsts))], dtype=torch.long, device=device)
        self._hooks: list = []

    def __enter__(self) -> _SharedRows:
        if self.layers:
            self._hooks = [
                self.layers[0].register_forward_pre_hook(self._cut),
                self.layers[-1].register_forward_hook(self._spread),
            ]
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _cut(self, module, args):
        return (args[0].index_select(0, self.first_rows), *args[1:])

    def _spread(self, module, args, output):
        return output.index_select(0, self.row_group)


class _RoomLayer(DynamicLayer):
    """An attention layer's cache while one child answers: ``keys`` / ``values`` ``[1, H_kv, n, D]`` copied once
    into buffers with ``room`` free entries after them; :meth:`update` writes what is fed there in place and
    returns views ``[1, H_kv, n + fed, D]``, so a decoding step copies no earlier entry (``DynamicLayer``
    concatenates: a copy of the whole layer per step)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        super().__init__()
        b, h, n, d = keys.shape
        self._keys, self._values = keys.new_empty(b, h, n + room, d), values.new_empty(b, h, n + room, d)
        self._keys[:, :, :n], self._values[:, :, :n] = keys, values
        self.device, self.is_initialized, self.length = keys.device, True, n
        self.keys, self.values = self._keys[:, :, :n], self._values[:, :, :n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        q = key_states.shape[-2]
        if self.length + q > self._keys.shape[2]:
            raise ValueError(f"fed {self.length + q} entries; the answer's cache has room for {self._keys.shape[2]}")
        self._keys[:, :, self.length : self.length + q] = key_states
        self._values[:, :, self.length : self.length + q] = value_states
        self.length += q
        self.keys, self.values = self._keys[:, :, : self.length], self._values[:, :, : self.length]
        return self.keys, self.values


class _FedEntriesLayer(DynamicLayer):
    """An attention layer's cache that stores nothing and returns the entries just fed: during a batched answer
    the layer's :class:`BatchKV`, and for a ragged child answering alone its :class:`RaggedKV`, keeps the kept
    entries and everything fed after the context."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return key_states, value_states


class _QuerySink:
    """Receives every query an attention layer computes and the log-sum-exp of its attention logits
    (``kvbench_sdpa`` calls ``record_queries`` and, as ``wants_lse`` is set, ``record_lse``)."""

    wants_lse = True

    def __init__(self, n_layers: int) -> None:
        self.queries: list[torch.Tensor | None] = [None] * n_layers
        self.lse: list[torch.Tensor | None] = [None] * n_layers

    def record_queries(self, f: int, query: torch.Tensor) -> None:
        self.queries[f] = query.detach()[0]

    def record_lse(self, f: int, lse: torch.Tensor) -> None:
        self.lse[f] = lse.detach()


class TorchParent(ParentSession):
    """Unpruned parent: full attention K/V, GDN end-of-context snapshot, signals and gate statistics. It may
    hold several live children (as many as memory holds) and answer them together (:meth:`answer_children`)."""

    max_live_children = None

    def __init__(self, engine: TorchEngine, session_id, token_ids, prot, cache, captured, query_window, seconds):
        super().__init__(session_id)
        self.engine = engine
        self.cache = cache
        self._set_context(engine, token_ids, prot, engine.adapter.attn_layer_ids, engine.adapter.gdn_layer_ids, seconds)
        self._signals = GdnSignals(beta=captured["beta"], g=captured["g"], vnorm=captured["vnorm"])
        self._gate = captured["gate"]
        self._queries = captured["queries"]
        self._query_start = self.n - min(query_window, self.n)
        self._children: list[TorchChild] = []

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

    def answer(self, question_ids, *, max_new_tokens, context_sha256, stop_ids=None, return_logits=False) -> Answer:
        self._check_live()
        check_context_sha(self.sha256, context_sha256)
        return self.engine._answer(self, self._full_kv(), question_ids, max_new_tokens, stop_ids, return_logits)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def model_fingerprint(self) -> str:
        return self.engine.fingerprint

    def probe(self, token_ids: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        self._check_live()
        return self.engine._probe(self, token_ids)

    @torch.no_grad()
    def fork(self, kept: Sequence[Sequence[torch.Tensor]]) -> TorchChild:
        self._check_live()
        self._check_can_fork()
        self.validate_kept(kept)
        start = time.perf_counter()
        layers = [self._compact(heads, k, v) for heads, (k, v) in zip(kept, self._full_kv(), strict=True)]
        stats = self._fork_stats(kept, layers)
        return self._adopt(TorchChild(self, self.engine._new_id(), layers, stats, time.perf_counter() - start))

    def _compact(self, heads: Sequence[torch.Tensor], keys: torch.Tensor, values: torch.Tensor):
        """One layer's kept entries in new storage: keys/values ``[1, H_kv, n, D]`` -> ``[1, H_kv, K, D]`` when
        every head keeps ``K``, else a :class:`RaggedKV` (packed, no padding)."""
        device = keys.device
        counts = [len(idx) for idx in heads]
        head_of = torch.repeat_interleave(torch.arange(len(heads), device=device), torch.tensor(counts, device=device))
        pos = torch.cat([idx.to(device) for idx in heads])
        child_keys, child_values = keys[0][head_of, pos], values[0][head_of, pos]  # [sum(counts), D], new storage
        if len(set(counts)) == 1:
            shape = (1, len(heads), counts[0], keys.shape[-1])
            return child_keys.view(shape), child_values.view(shape)
        return RaggedKV(child_keys, child_values, counts)

    def _fork_stats(self, kept: Sequence[Sequence[torch.Tensor]], layers: Sequence) -> ForkStats:
        """What the child holds, measured on its own tensors; ``real_fork`` from :func:`is_real_fork`."""
        child = [t for kv in layers for t in (kv.tensors() if isinstance(kv, RaggedKV) else kv)]
        parent = [t for kv in self._full_kv() for t in kv]
        kept_entries = sum(len(idx) for heads in kept for idx in heads)
        entry_bytes = 2 * self.head_dim * parent[0].element_size()  # one key and one value
        return ForkStats(
            kept_entries=kept_entries,
            full_entries=self.n * self.n_kv_heads * self.n_attn_layers,
            stored_bytes=sum(_storage_bytes(t) for t in child),
            full_bytes=sum(_storage_bytes(t) for t in parent),
            padded=False,
            real_fork=is_real_fork(child, parent, kept_entries * entry_bytes),
        )

    def _check_children(self, children: Sequence, context_sha256: str) -> None:
        """Refuse children that are not live :class:`TorchChild` ren of this live parent, or another context's hash."""
        self._check_live()
        check_context_sha(self.sha256, context_sha256)
        for child in children:
            if getattr(child, "parent", None) is not self:
                name = getattr(child, "session_id", child)
                raise ProtocolError(f"session {name} is not a child of parent {self.session_id}")
            child._check_live()
            if not isinstance(child, TorchChild):
                raise ProtocolError(f"child {child.session_id} holds no compacted layers to batch (not a TorchChild)")

    def answer_children(
        self, children, question_ids, *, max_new_tokens, context_sha256, stop_ids=None, return_logits: bool = False
    ) -> list[Answer]:
        """One question answered by every child of ``children`` in one batched greedy loop (one child alone: the
        one-at-a-time path, :meth:`TorchChild.answer`). The tokens equal each child's own answer's up to float
        rounding of the batched kernels (the tests hold them token-identical, and the step logits within float32
        rounding). ``return_logits``: each answer carries its ``step_logits`` (``[steps, vocab]`` float32)."""
        self._check_children(children, context_sha256)
        if len(children) == 1:  # alone: the one-at-a-time path
            (child,) = children
            kw = {"max_new_tokens": max_new_tokens, "context_sha256": context_sha256, "stop_ids": stop_ids}
            return [child.answer(question_ids, **kw, return_logits=return_logits)]
        lane = _Lane(self, [c.layers for c in children], question_ids, max_new_tokens)
        return self.engine._answer_groups([lane], stop_ids, return_logits)[0]

    def answer_batch_limit(self, question_tokens: int, max_new_tokens: int, *, forked: bool = False) -> int:
        """How many children fit at once in :data:`BATCH_MEMORY_SHARE` of the memory free now, each counted at its
        worst: a full-cache child's storage (unless ``forked``: it exists already) plus its padded rows in the
        batch, and its GDN states."""
        self._check_live()
        full = self._full_kv()
        per_entry = sum(2 * k.shape[1] * k.shape[-1] * k.element_size() for k, _ in full)  # one position, all layers
        gdn = 0
        for layer_idx in self.gdn_layer_ids:
            layer = self.cache.layers[layer_idx]
            for states in (layer.conv_states, layer.recurrent_states):
                gdn += sum(t.numel() * t.element_size() for t in states.values() if t is not None)
        storage = 0 if forked else self.n
        per_child = per_entry * (storage + self.n + question_tokens + max_new_tokens) + gdn
        return max(1, int(BATCH_MEMORY_SHARE * free_memory_bytes(self.engine.device)) // per_child)

    def release(self) -> None:
        if self._released:
            return
        for child in self.live_children():
            child.release()
        self._released = True
        self.cache = None
        self._signals = self._gate = self._queries = None


class TorchChild(ChildSession):
    """Compacted child: ``layers[f]`` is ``(keys, values)`` each ``[1, H_kv, K_f, D]`` when every KV head of
    layer ``f`` keeps ``K_f`` entries, else a :class:`RaggedKV` (per-head counts, no padding)."""

    def __init__(self, parent: TorchParent, session_id, layers, stats: ForkStats, fork_seconds: float):
        super().__init__(session_id, parent, stats, fork_seconds)
        self.layers = layers

    def answer(self, question_ids, *, max_new_tokens, context_sha256, stop_ids=None, return_logits=False) -> Answer:
        self._check_answerable(context_sha256)
        return self.parent.engine._answer(
            self.parent, self.layers, question_ids, max_new_tokens, stop_ids, return_logits
        )

    def release(self) -> None:
        self._released = True
        self.layers = None


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


class TorchRunEngine(TorchEngine):
    """The ``torch`` engine as ``kvbench run --engine torch`` builds it (the class :data:`kvbench.engines.ENGINES`
    holds): :class:`TorchEngine` on the loaded model ``lm``, already on its device (``length`` and ``device``
    need nothing more)."""

    @classmethod
    def decode_path(cls) -> str:
        """kvbench's decode kernels or PyTorch for float32 CPU decoding (:mod:`~kvbench.engines.decode_kernel`);
        other dtypes and devices run PyTorch."""
        from kvbench.engines import decode_kernel

        return decode_kernel.status()

    def __init__(self, lm: LoadedModel, length: int, device: str = "cpu") -> None:
        super().__init__(lm.model, lm.tokenizer, fingerprint=lm.fingerprint)
