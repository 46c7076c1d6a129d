"""kvbench's decode-attention kernel against SDPA, side by side in one run, on the shapes a decoding step has.

Three cases, one attention layer each (float32, CPU, random entries; head_dim ``--head-dim``, 2 KV heads, 2 query
heads per KV head as in the shipped tiny models):

- ``batch``: a batched decoding step of 64 children of a ``--length``-entry context (7 methods x the nine p plus
  keep-all: the kept counts of Part A of ``benchmarks/sweep_throughput.py``), bucketed by ``BatchKV`` exactly as
  the torch engine does; SDPA is the engine's path without the kernel (one masked SDPA call per bucket, query heads
  folded), the kernel one call for every row and head.
- ``flat``: one full child answering alone (``[1, H_kv, length, D]``): SDPA with GQA against the kernel.
- ``ragged``: one ``global`` child alone, its heads keeping 70 % and 30 %: one SDPA call per head against the kernel.

Each case alternates the two ``--repeats`` times after a warm-up and prints medians, the kept entries' bytes read
per second (keys and values) and the ratio, and the largest difference between the two outputs. Usage::

    python benchmarks/decode_attention.py --length 4096 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from kvbench.engines import decode_kernel
from kvbench.engines.attention import RaggedKV, _ragged_sdpa
from kvbench.engines.batch_kv import BatchKV

PS = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]


def _timed(fn, repeats: int) -> tuple[float, torch.Tensor]:
    out = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def _compare(name: str, entries: int, D: int, sdpa, kernel, repeats: int, diff: float) -> None:
    """Alternate the two (each timed ``repeats`` times, interleaved in blocks of one) and print a line; ``diff``: the
    largest difference of their outputs on the same entries."""
    ts, tk = [], []
    for _ in range(repeats):
        ts.append(_timed(sdpa, 1)[0])
        tk.append(_timed(kernel, 1)[0])
    ts_m, tk_m = statistics.median(ts), statistics.median(tk)
    gb = entries * D * 4 * 2 / 1e9
    print(
        f"  {name:<7} {entries:>9,} {ts_m * 1e3:>9.2f} {gb / ts_m:>7.1f} {tk_m * 1e3:>10.2f} {gb / tk_m:>7.1f} "
        f"{ts_m / tk_m:>6.2f}x {diff:>9.1e}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=4096, help="context entries per KV head")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not decode_kernel.available():
        raise SystemExit(f"the kernel is off here: {decode_kernel.status()}")
    torch.manual_seed(0)
    n, D, H_kv, H = args.length, args.head_dim, 2, 4
    scale = D**-0.5
    print(f"decode attention, one layer, {H_kv} KV heads x {H // H_kv} query heads, head_dim {D}, float32, "
          f"{torch.get_num_threads()} threads, kernel {decode_kernel.status()}, median of {args.repeats}")  # fmt: skip
    print(f"  {'case':<7} {'entries':>9} {'sdpa ms':>9} {'GB/s':>7} {'kernel ms':>10} {'GB/s':>7} {'ratio':>7} "
          f"{'max diff':>9}")  # fmt: skip

    counts = [n] + [max(1, round(p * n)) for p in PS for _ in range(7)]  # 64 children, widest first
    rows = [[(torch.randn(c, D), torch.randn(c, D)) for _ in range(H_kv)] for c in counts]
    steps = 4 * args.repeats + 4  # each timed pass feeds one entry (a warm-up and a timed call per pass, two ways)
    B = len(rows)
    query, new_k, new_v = torch.randn(B, H, 1, D), torch.randn(B, H_kv, 1, D), torch.randn(B, H_kv, 1, D)
    real_applies = decode_kernel.applies

    def step(batch: BatchKV, use_kernel: bool) -> torch.Tensor:
        decode_kernel.applies = (lambda q: True) if use_kernel else (lambda q: False)
        try:
            return batch.attend(query, new_k, new_v, scale)
        finally:
            decode_kernel.applies = real_applies

    diff = (step(BatchKV(rows, extra=1), False) - step(BatchKV(rows, extra=1), True)).abs().max().item()
    batch = BatchKV(rows, extra=steps)  # timed: every pass feeds one more entry
    _compare("batch", sum(counts) * H_kv, D, lambda: step(batch, False), lambda: step(batch, True), args.repeats, diff)

    keys, values, q1 = torch.randn(1, H_kv, n, D), torch.randn(1, H_kv, n, D), torch.randn(1, H, 1, D)
    jobs = decode_kernel.DecodeJobs.heads(keys[0], values[0])
    flat_sdpa = lambda: F.scaled_dot_product_attention(q1, keys, values, scale=scale, enable_gqa=True)  # noqa: E731
    flat_kernel = lambda: decode_kernel.decode_step(q1, jobs, scale)  # noqa: E731
    diff = (flat_sdpa() - flat_kernel()).abs().max().item()
    _compare("flat", n * H_kv, D, flat_sdpa, flat_kernel, args.repeats, diff)

    head_counts = [int(0.7 * n), int(0.3 * n)]
    ragged = RaggedKV(torch.randn(sum(head_counts), D), torch.randn(sum(head_counts), D), head_counts).with_room(steps)
    fed = torch.randn(1, H_kv, 1, D)

    def ragged_run(use_kernel: bool):
        decode_kernel.applies = (lambda q: True) if use_kernel else (lambda q: False)
        try:
            ragged.fed = 0  # attend the same entries every time
            return _ragged_sdpa(q1, fed, fed, ragged, scale)
        finally:
            decode_kernel.applies = real_applies

    diff = (ragged_run(False) - ragged_run(True)).abs().max().item()
    entries = sum(head_counts) + H_kv
    _compare("ragged", entries, D, lambda: ragged_run(False), lambda: ragged_run(True), args.repeats, diff)


if __name__ == "__main__":
    main()
