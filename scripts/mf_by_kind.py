"""SCBench mf scores by question kind: which of the seven kinds (largest, second largest, ..., median) a model
answers, and whether it answers from the list at all. Reads the rows of generated mf contexts from kvbench results
directories and prints, per model, method, allocation, p and kind: the mean score, the number of questions and
how many distinct answers it gave (a model that writes the same number whatever the list, as the shipped
models do, gives one or two per kind), then a few ``prediction/label`` pairs.

Usage: .venv/bin/python scripts/mf_by_kind.py RESULTS_DIR [RESULTS_DIR ...] [--examples 6]
(the rows of ``kvbench run --bench scbench --task mf``; hub rows, which carry no generator seed, are left out).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from kvbench.results.read import read_results
from kvbench.tasks.scbench_generate import MF_KINDS, mf_kinds


def by_kind(rows: list[dict]) -> dict[tuple, dict[str, list[tuple[float, str, str]]]]:
    """(model, method, allocation, p) -> kind -> [(score, prediction, label)], for generated mf rows."""
    table: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    kinds: dict[tuple[int, int], list[str]] = {}
    for r in rows:
        if r.get("bench") != "scbench" or r.get("task") != "mf" or r.get("source") != "generated":
            continue
        seed, index = int(r["seed"]), int(r["meta"]["row"])
        if (seed, index) not in kinds:
            kinds[seed, index] = mf_kinds(seed, index)
        kind = kinds[seed, index][int(r["question"])]
        group = (r["model"], r["method"], r["allocation"], r["p"])
        table[group][kind].append((float(r["score"]), str(r["prediction"]).strip(), str(r["references"][0])))
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, nargs="+")
    ap.add_argument("--examples", type=int, default=6, help="prediction/label pairs shown per kind")
    args = ap.parse_args(argv)
    read = read_results(args.results)
    table = by_kind(read.rows)
    if not table:
        raise SystemExit(f"{', '.join(map(str, args.results))}: no generated SCBench mf rows")
    for (model, method, allocation, p), kinds in sorted(table.items(), key=lambda kv: tuple(map(str, kv[0]))):
        scores = [s for rows in kinds.values() for s, _, _ in rows]
        print(f"{model} / {method} [{allocation}] p={p}: mf {sum(scores) / len(scores):.1f} ({len(scores)} questions)")
        for kind in (k for k in MF_KINDS if k in kinds):
            rows = kinds[kind]
            mean = sum(s for s, _, _ in rows) / len(rows)
            distinct = len({pred for _, pred, _ in rows})
            shown = " ".join(f"{pred}/{label}" for _, pred, label in rows[: args.examples])
            print(f"  {kind:23s} {mean:5.1f}  n={len(rows):3d}  distinct answers {distinct:3d}   {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
