"""Scoring cost by context length (the paper's Table 2): prefill seconds, scoring seconds and their ratio.

For each length, one random context is prefilled ``repeats + 1`` times (the first is a warm-up); every
method scores each parent. Medians are reported, all measured side by side in one process.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from kvbench.engines.torch_engine import TorchEngine
from kvbench.methods import get_method


@dataclass(frozen=True)
class CostRow:
    method: str
    length: int
    prefill_s: float
    score_s: float

    @property
    def ratio(self) -> float:
        return self.score_s / self.prefill_s


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
        for rep in range(repeats + 1):
            parent = engine.prefill(ids, prot=min(64, n // 2), query_window=window)
            for method in instances:
                start = time.perf_counter()
                method.score(parent)
                if rep:
                    scoring[method.name].append(time.perf_counter() - start)
            if rep:
                prefill.append(parent.prefill_seconds)
            parent.release()
        for method in instances:
            rows.append(CostRow(method.name, n, statistics.median(prefill), statistics.median(scoring[method.name])))
    return rows


def save_cost(rows: Sequence[CostRow], path: Path, meta: dict) -> Path:
    """Write ``{"meta": …, "rows": [{method, length, prefill_s, score_s, ratio}]}`` as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "rows": [{**asdict(r), "ratio": r.ratio} for r in rows]}
    path.write_text(json.dumps(data, indent=2))
    return path
