"""Scoring cost by context length (the paper's Table 2): prefill seconds, scoring seconds and their ratio.

For each length, one random context is prefilled ``repeats + 1`` times (the first is a warm-up); every
method scores each parent. Medians are reported, all measured side by side in one process.

Storage of a ragged allocation (:attr:`kvbench.allocations.Allocation.ragged`: per-head counts differ, e.g.
``global``): for each method whose default allocation is ragged, its last scores are selected with it at
``STORAGE_P`` and forked; the child's ``stored_bytes`` is set
against the bytes its kept entries need and against what a layout padded to each layer's widest head
would store.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from kvbench.allocations import get_allocation
from kvbench.atomic import write_json
from kvbench.engines.torch_engine import TorchEngine
from kvbench.methods import get_method

STORAGE_P = (0.5, 0.1)


@dataclass(frozen=True)
class StorageRow:
    """Bytes of one ragged child: stored (measured on the child), needed (kept entries x K+V bytes per
    entry), padded (each layer's widest head times its KV heads)."""

    p: float
    stored_bytes: int
    needed_bytes: int
    padded_bytes: int

    @property
    def stored_over_needed(self) -> float:
        return self.stored_bytes / self.needed_bytes

    @property
    def padded_over_needed(self) -> float:
        return self.padded_bytes / self.needed_bytes


@dataclass(frozen=True)
class CostRow:
    method: str
    length: int
    prefill_s: float
    score_s: float
    storage: tuple[StorageRow, ...] = ()

    @property
    def ratio(self) -> float:
        return self.score_s / self.prefill_s


def measure_storage(
    parent, method, scores: Sequence[torch.Tensor], ps: Sequence[float] = STORAGE_P
) -> list[StorageRow]:
    """Fork ``parent`` with ``method``'s selection of ``scores`` by its default allocation at each p; bytes per
    child."""
    entry_bytes = 2 * parent.head_dim * parent.keys(0).element_size()
    rows = []
    for p in ps:
        kept = method.select(parent, scores, p, method.default_allocation)
        child = parent.fork(kept)
        padded = sum(max(len(idx) for idx in heads) * len(heads) for heads in kept) * entry_bytes
        rows.append(StorageRow(p, child.stats.stored_bytes, child.stats.kept_entries * entry_bytes, padded))
        child.release()
    return rows


def measure_cost(
    engine: TorchEngine, methods: Sequence[str], lengths: Sequence[int], repeats: int = 3, seed: int = 0
) -> list[CostRow]:
    """Median prefill and scoring seconds per (method, length) after one warm-up round."""
    instances = [get_method(name, seed) for name in methods]
    window = max([m.query_window for m in instances] + [1])
    vocab = min(256, engine.model.config.get_text_config().vocab_size)
    rows = []
    for n in lengths:
        ids = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed + n)).tolist()
        prefill: list[float] = []
        scoring: dict[str, list[float]] = {m.name: [] for m in instances}
        storage: dict[str, tuple[StorageRow, ...]] = {}
        for rep in range(repeats + 1):
            parent = engine.prefill(ids, prot=min(64, n // 2), query_window=window)
            for method in instances:
                start = time.perf_counter()
                scores = method.score(parent)
                if rep:
                    scoring[method.name].append(time.perf_counter() - start)
                if rep == repeats and get_allocation(method.default_allocation).ragged:
                    storage[method.name] = tuple(measure_storage(parent, method, scores))
            if rep:
                prefill.append(parent.prefill_seconds)
            parent.release()
        for method in instances:
            med = statistics.median
            rows.append(CostRow(method.name, n, med(prefill), med(scoring[method.name]), storage.get(method.name, ())))
    return rows


def save_cost(rows: Sequence[CostRow], path: Path, meta: dict) -> Path:
    """Write ``{"meta": …, "rows": [{method, length, prefill_s, score_s, ratio, storage: [{p, stored_bytes,
    needed_bytes, padded_bytes, stored/needed, padded/needed}]}]}`` as JSON."""
    data = {
        "meta": meta,
        "rows": [
            {
                **asdict(r),
                "ratio": r.ratio,
                "storage": [
                    {**asdict(x), "stored/needed": x.stored_over_needed, "padded/needed": x.padded_over_needed}
                    for x in r.storage
                ],
            }
            for r in rows
        ],
    }
    write_json(path, data, indent=2)
    return path
