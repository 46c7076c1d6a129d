"""One attention layer's kept entries for several children decoding together (batched answering).

Every child of a context keeps its own entries per KV head (different counts across children, heads and
layers). For a batched decode the children of one layer are grouped into *buckets* of rows with similar kept
counts; each bucket is one preallocated buffer ``keys[b, H_kv, K_b + extra, D]`` holding every row's kept entries
left-aligned in ``0 .. counts[r, h] - 1`` (the rest of ``0 .. K_b - 1`` is padding, masked), followed by the
``extra`` entries fed after the context (question and answer tokens, written in place as they come). A bucket is
attended with one SDPA call; buckets bound the padding a batch of very different sizes would otherwise carry
(a p = 0.1 child padded to a full-cache child's length reads 10x its own entries).

The query heads that share a KV head are folded into the query-length dimension (``[b, H, q, D] -> [b, H_kv,
n_rep * q, D]``), so SDPA reads each KV head once instead of once per query head.

Used by :mod:`kvbench.engines.torch_engine` through ``module.kvbench_batch`` (:func:`kvbench_sdpa` calls
:meth:`BatchKV.attend`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F

from kvbench.engines import decode_kernel

#: A row starts a new bucket when its widest head keeps fewer than this fraction of the bucket's widest row.
BUCKET_RATIO = 0.75
#: The smallest block an :class:`Arena` takes from the allocator, in bytes.
ARENA_BLOCK_BYTES = 64 * 2**20
_ALIGN = 64  # bytes: where each buffer of an arena block starts


class Arena:
    """Storage for the bucket buffers of one batched answer at a time, kept for the next one.

    A batched answer copies every child's kept entries into fresh buffers (hundreds of MB for 64 children of a
    4,096-token context). On CPU, memory freed that large goes back to the OS and the next answer's buffers are
    faulted in again page by page, which costs more than the copy into them; an arena keeps its blocks and hands
    them out again. :meth:`reset` starts over (every buffer handed out before is then reused: call it only when
    none is in use); the blocks stay until the arena is dropped.
    """

    def __init__(self) -> None:
        self.blocks: list[torch.Tensor] = []  # uint8, one per allocation from the allocator
        self._block, self._offset = 0, 0

    def reset(self) -> None:
        """Hand the blocks out again from the start."""
        self._block, self._offset = 0, 0

    @property
    def nbytes(self) -> int:
        """Bytes the arena holds."""
        return sum(b.numel() for b in self.blocks)

    def empty(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised contiguous tensor of ``shape`` and ``dtype`` on ``device`` from the arena's blocks."""
        nbytes = math.prod(shape) * dtype.itemsize
        while self._block < len(self.blocks):
            block = self.blocks[self._block]
            if block.device == torch.device(device) and self._offset + nbytes <= block.numel():
                break
            self._block, self._offset = self._block + 1, 0
        else:
            self.blocks.append(torch.empty(max(nbytes, ARENA_BLOCK_BYTES), dtype=torch.uint8, device=device))
            self._offset = 0
        block = self.blocks[self._block]
        out = block[self._offset : self._offset + nbytes].view(dtype).view(tuple(shape))
        self._offset += -(-nbytes // _ALIGN) * _ALIGN
        return out


@dataclass
class _Bucket:
    """Rows ``start .. stop - 1`` of the batch: ``keys`` / ``values`` ``[b, H_kv, width + extra, D]``, ``counts``
    ``[b, H_kv]`` kept entries per row and head, ``width`` the padded kept length, ``extra`` the room after it for
    entries fed after the context, ``filled`` entries written there. ``padded``: whether any row's head keeps
    fewer than ``width`` entries (only then is a mask needed); the visibility mask over the whole buffer is built
    once and sliced at every step."""

    start: int
    stop: int
    keys: torch.Tensor
    values: torch.Tensor
    counts: torch.Tensor
    width: int
    extra: int
    filled: int = 0
    padded: bool = field(init=False)
    _visible: torch.Tensor | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.padded = bool((self.counts < self.width).any())

    def visible(self, length: int) -> torch.Tensor:
        """``[b, H_kv, 1, length]`` bool over the buffer's first ``length`` entries: True at a row's head's kept
        entries and at every entry fed after the context, False on padding."""
        if self._visible is None:
            cols = torch.arange(self.keys.shape[2], device=self.counts.device)
            self._visible = ((cols < self.counts[..., None]) | (cols >= self.width))[:, :, None, :]
        return self._visible[..., :length]

    def take(self, idx: torch.Tensor) -> None:
        """Keep only the local rows ``idx`` (ascending), moved down in place (the buffers may be an arena's)."""
        for j, r in enumerate(idx.tolist()):
            if r != j:  # r > j: row r's storage is not overwritten before it is read
                self.keys[j].copy_(self.keys[r])
                self.values[j].copy_(self.values[r])
        n = len(idx)
        self.keys, self.values, self.counts = self.keys[:n], self.values[:n], self.counts[idx]
        self.padded = bool((self.counts < self.width).any())
        self._visible = self._visible[idx] if self._visible is not None and self.padded else None


def bucket_bounds(widths: Sequence[int], ratio: float = BUCKET_RATIO) -> list[tuple[int, int]]:
    """Consecutive row ranges ``(start, stop)`` over rows of kept widths ``widths`` (in batch order): a row joins
    the open bucket unless its width is below ``ratio`` times the bucket's widest row (or above its narrowest
    divided by ``ratio``), then it opens the next one."""
    bounds: list[tuple[int, int]] = []
    start, hi, lo = 0, None, None
    for r, w in enumerate(widths):
        if hi is not None and (w < ratio * hi or w * ratio > lo):
            bounds.append((start, r))
            start, hi, lo = r, None, None
        hi = w if hi is None else max(hi, w)
        lo = w if lo is None else min(lo, w)
    if len(widths):
        bounds.append((start, len(widths)))
    return bounds


class BatchKV:
    """The kept entries of ``B`` children in one attention layer, bucketed (see the module docstring).

    rows: per child (batch row), per KV head, ``(keys [K_rh, D], values [K_rh, D])`` of its kept entries in
    position order. extra: how many entries each row will be fed after the context (question + answer tokens).
    """

    def __init__(
        self, rows: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]], extra: int, arena: Arena | None = None
    ) -> None:
        if not rows:
            raise ValueError("a batch needs at least one child")
        self.n_kv_heads = len(rows[0])
        first = rows[0][0][0]
        self.head_dim, self.dtype, self.device = first.shape[-1], first.dtype, first.device
        empty = arena.empty if arena is not None else self._fresh
        counts = torch.tensor([[len(k) for k, _ in heads] for heads in rows], dtype=torch.long)
        self._jobs: decode_kernel.DecodeJobs | None = None
        self.buckets = [
            self._bucket(rows[a:b], counts[a:b], a, b, extra, empty)
            for a, b in bucket_bounds(counts.max(1).values.tolist())
        ]

    def _bucket(self, rows, counts: torch.Tensor, start: int, stop: int, extra: int, empty) -> _Bucket:
        width = int(counts.max())
        shape = (stop - start, self.n_kv_heads, width + extra, self.head_dim)
        keys = empty(shape, self.dtype, self.device)
        values = empty(shape, self.dtype, self.device)
        for r, heads in enumerate(rows):
            for h, (k, v) in enumerate(heads):
                keys[r, h, : len(k)] = k
                values[r, h, : len(v)] = v
                keys[r, h, len(k) : width] = 0  # padding: masked, but finite (0 x NaN would leak into the output)
                values[r, h, len(v) : width] = 0
        return _Bucket(start, stop, keys, values, counts.to(self.device), width, extra)

    @staticmethod
    def _fresh(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, device=device)

    def _layout(self) -> tuple:
        return self.n_kv_heads, self.head_dim, self.dtype, self.device

    @classmethod
    def concat(cls, parts: Sequence["BatchKV"]) -> "BatchKV":
        """One batch of the rows of ``parts`` (one layer's batches of several questions or contexts), in order: their
        buckets, renumbered; each bucket keeps its own fed entries and room, so parts may have been fed different
        numbers of question tokens. The parts give their buckets up: use only the result afterwards."""
        if not parts:
            raise ValueError("nothing to concatenate")
        layout = parts[0]._layout()
        if any(p._layout() != layout for p in parts):
            raise ValueError("batches of different layer shapes, dtypes or devices cannot be concatenated")
        merged = cls.__new__(cls)
        merged.n_kv_heads, merged.head_dim, merged.dtype, merged.device = layout
        merged.buckets, merged._jobs, at = [], None, 0
        for part in parts:
            for bk in part.buckets:
                rows = bk.stop - bk.start
                bk.start, bk.stop = at, at + rows
                at += rows
                merged.buckets.append(bk)
        return merged

    @property
    def size(self) -> int:
        """Rows (children) in the batch."""
        return self.buckets[-1].stop if self.buckets else 0

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None) -> torch.Tensor:
        """Write the ``q`` new entries ``key`` / ``value`` ``[B, H_kv, q, D]`` after each row's kept ones and attend
        ``query`` ``[B, H, q, D]`` (the last ``q`` positions, bottom-right causal over the new entries) to them.
        Returns ``[B, H, q, D]``."""
        B, H, q, D = query.shape
        if B != self.size:
            raise ValueError(f"query batch {B} != the {self.size} rows of the layer's batch")
        n_rep = H // self.n_kv_heads
        if decode_kernel.applies(query):
            return self._decode(query, key, value, scale)
        self._jobs = None  # the kernel's job table counts fed entries; rebuilt when next needed
        out = []
        for bk in self.buckets:
            rows = slice(bk.start, bk.stop)
            b = bk.stop - bk.start
            if bk.filled + q > bk.extra:
                raise ValueError(f"fed {bk.filled + q} entries after the context; the batch has room for {bk.extra}")
            at = bk.width + bk.filled
            bk.keys[:, :, at : at + q] = key[rows]
            bk.values[:, :, at : at + q] = value[rows]
            bk.filled += q
            if q > 1 and query.device.type == "cpu" and at > 0:
                out.append(self._attend_block(bk, query[rows], at, scale))
                continue
            length = bk.width + bk.filled
            folded = query[rows].reshape(b, self.n_kv_heads, n_rep * q, D)  # query heads of one KV head as rows
            mask = self._mask(bk, q, n_rep)
            o = F.scaled_dot_product_attention(
                folded, bk.keys[:, :, :length], bk.values[:, :, :length], attn_mask=mask, scale=scale
            )
            out.append(o.reshape(b, H, q, D))
        return torch.cat(out, 0) if len(out) > 1 else out[0]

    def _decode(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None) -> torch.Tensor:
        """One decoding step of every row by :mod:`~kvbench.engines.decode_kernel`, which writes the new entries
        after each row's fed ones and attends each (row, KV head) to its kept entries followed by its fed ones: the
        same arithmetic as the row's child answering alone. query ``[B, H, 1, D]``; returns ``[B, H, 1, D]``."""
        for bk in self.buckets:
            if bk.filled + 1 > bk.extra:
                raise ValueError(f"fed {bk.filled + 1} entries after the context; the batch has room for {bk.extra}")
        jobs = self._decode_jobs()
        out = decode_kernel.decode_step(query, jobs, scale, key, value)
        jobs.n2 += 1
        for bk in self.buckets:
            bk.filled += 1
        return out

    def _decode_jobs(self) -> decode_kernel.DecodeJobs:
        """The kernel's job table, one job per (row, KV head) in row order: kept entries at the start of the
        bucket's buffer, fed ones from its ``width`` on. Built once and kept while the rows and buffers stay."""
        if self._jobs is None:
            parts = [[], [], [], [], []]
            for bk in self.buckets:
                b, h = bk.counts.shape
                S, nbytes = bk.keys.shape[2], self.head_dim * bk.keys.element_size()
                at = torch.arange(b * h, dtype=torch.int64) * (S * nbytes)
                parts[0].append(at + bk.keys.data_ptr())
                parts[1].append(at + bk.values.data_ptr())
                parts[2].append(bk.counts.reshape(-1).cpu())
                parts[3].append(torch.full((b * h,), bk.width, dtype=torch.int64))
                parts[4].append(torch.full((b * h,), bk.filled, dtype=torch.int64))
            self._jobs = decode_kernel.DecodeJobs(*(torch.cat(p) for p in parts))
        return self._jobs

    def _attend_block(self, bk: _Bucket, query: torch.Tensor, before: int, scale: float | None) -> torch.Tensor:
        """A block of ``q > 1`` new queries on CPU, without a ``[q, L]`` mask: SDPA's flash kernel (which returns the
        log-sum-exp) once over the ``before`` entries every query sees (kept, padding masked per row and head, and
        earlier fed ones; the query heads of a KV head folded into rows) and once over the block's own entries
        (square causal), merged by their log-sum-exps in float32: the attention over both, up to float rounding.
        query ``[b, H, q, D]``; returns ``[b, H, q, D]``."""
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        b, H, q, D = query.shape
        n_rep = H // self.n_kv_heads
        mask = None
        if bk.padded:  # the flash kernel takes an additive mask of the query's dtype
            hidden = ~bk.visible(before)
            mask = torch.zeros(hidden.shape, dtype=query.dtype, device=query.device).masked_fill_(hidden, float("-inf"))
        folded = query.reshape(b, self.n_kv_heads, n_rep * q, D)
        seen = (bk.keys[:, :, :before], bk.values[:, :, :before])
        out_seen, lse_seen = flash(folded, *seen, 0.0, False, attn_mask=mask, scale=scale)
        out_seen, lse_seen = out_seen.reshape(b, H, q, D).float(), lse_seen.reshape(b, H, q).float()
        if before == bk.width and bool((bk.counts == 0).any()):  # a head that sees nothing: weight 0, not lse 0
            empty = (bk.counts == 0).repeat_interleave(n_rep, 1)[..., None]
            lse_seen = lse_seen.masked_fill(empty, float("-inf"))
            out_seen = out_seen.masked_fill(empty[..., None], 0.0)
        own = [t[:, :, before : before + q].repeat_interleave(n_rep, 1) for t in (bk.keys, bk.values)]
        out_own, lse_own = flash(query, *own, 0.0, True, scale=scale)
        lse_own = lse_own.float()
        lse = torch.logaddexp(lse_seen, lse_own)
        merged = out_seen * (lse_seen - lse).exp()[..., None] + out_own.float() * (lse_own - lse).exp()[..., None]
        return merged.to(query.dtype)

    @staticmethod
    def _mask(bk: _Bucket, q: int, n_rep: int) -> torch.Tensor | None:
        """SDPA's bool mask for ``q`` new queries (folded: ``n_rep * q`` rows per KV head), or None when every
        entry is visible to every row (no padding and one query)."""
        if q == 1:  # one mask row, broadcast over the folded query heads
            return bk.visible(bk.width + bk.filled) if bk.padded else None
        before = bk.width + bk.filled - q  # what every query sees, then the block's own entries, causal
        b, h_kv = bk.counts.shape
        own = torch.ones(q, q, dtype=torch.bool, device=bk.counts.device).tril().repeat(n_rep, 1)  # row r * q + i: i
        seen = bk.visible(before).expand(b, h_kv, n_rep * q, before)
        return torch.cat([seen, own.expand(b, h_kv, n_rep * q, q)], -1)

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` (ascending indices into the current rows); the others leave the batch."""
        keep = keep.tolist()
        buckets, at = [], 0
        for bk in self.buckets:
            local = [r - bk.start for r in keep if bk.start <= r < bk.stop]
            if not local:
                continue
            idx = torch.tensor(local, device=bk.keys.device)
            if len(local) < bk.stop - bk.start:
                bk.take(idx)
            bk.start, bk.stop = at, at + len(local)
            at = bk.stop
            buckets.append(bk)
        self.buckets, self._jobs = buckets, None
