"""Print a model's card targets (issue 44) from the result rows of ``scripts/card_numbers.sh``.

Usage: ``python scripts/card_targets.py OUT [--before-1024 MEAN]`` where OUT holds the sub-directories
``ruler-full``, ``ruler-1024``, ``scbench`` (seed 42) and, when measured, ``scbench-seed43`` (the second
evaluation seed, which no training row used). Each figure is the mean of per-question scores (0–100) of one
(bench, task, method, p) at the length the rows were run at; a target line says PASS or MISS and by how much.
``--before-1024``: the five-task mean at 1,024 tokens before issue 44's stages (tiny-trained 52.1,
tiny-trained-dense 51.3), which may fall by at most 3 points.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from statistics import mean

FIVE = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "fwe")
SCBENCH = ("kv", "mf", "prefix_suffix", "vt")


def read_scores(directory: Path) -> dict[tuple[str, str, str, float, int], list[float]]:
    """Scores by (bench, task, method, p, length) from every ``results*.jsonl`` of ``directory``."""
    scores: dict[tuple[str, str, str, float, int], list[float]] = defaultdict(list)
    for path in sorted(directory.glob("results*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                scores[(row["bench"], row["task"], row["method"], float(row["p"]), int(row["length"]))].append(
                    float(row["score"])
                )
    return scores


def task_means(scores: dict, bench: str, method: str, p: float) -> dict[str, tuple[float, int]]:
    """(mean, n) per task of one bench / method / p (one length per directory)."""
    return {
        task: (mean(v), len(v)) for (b, task, m, pp, _), v in sorted(scores.items()) if (b, m, pp) == (bench, method, p)
    }


def target(name: str, value: float | None, op: str, bound: float) -> str:
    if value is None:
        return f"  {name}: not measured (target {op} {bound:g})"
    ok = value >= bound if op == ">=" else value <= bound
    return f"  {name}: {value:.1f} (target {op} {bound:g}) {'PASS' if ok else f'MISS by {abs(value - bound):.1f}'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--before-1024", type=float, help="the five-task mean at 1,024 tokens before issue 44's stages")
    args = ap.parse_args()
    full = read_scores(args.out / "ruler-full")
    r1024 = read_scores(args.out / "ruler-1024")
    ruler = task_means(full, "ruler", "full", 1.0)
    print("RULER, full cache, at the model's length:")
    for task, (m, n) in ruler.items():
        print(f"  {task}: {m:.1f} ({n} items)")
    five = [ruler[t][0] for t in FIVE if t in ruler]
    r1 = task_means(r1024, "ruler", "full", 1.0)
    five_1024 = [r1[t][0] for t in FIVE if t in r1]
    print("targets:")
    print(target("RULER niah_single_1", ruler.get("niah_single_1", (None,))[0], ">=", 95))
    print(target("RULER five-task mean", mean(five) if len(five) == 5 else None, ">=", 45))
    m1024 = mean(five_1024) if len(five_1024) == 5 else None
    if args.before_1024 is not None:
        print(target("1,024-token five-task mean", m1024, ">=", args.before_1024 - 3))
    else:
        print(f"  1,024-token five-task mean: {m1024 if m1024 is None else f'{m1024:.1f}'}")
    for sub in ("scbench", "scbench-seed43"):
        if not (args.out / sub).is_dir():
            print(f"  {sub}: not measured")
            continue
        scb = read_scores(args.out / sub)
        sc = task_means(scb, "scbench", "full", 1.0)
        sc_rand = task_means(scb, "scbench", "random", 0.1)
        print(
            f"SCBench generated ({sub}), full cache:",
            ", ".join(f"{t} {m:.1f} ({n} questions)" for t, (m, n) in sc.items()),
        )
        kv = sc.get("kv", (None,))[0]
        print(target(f"{sub} kv", kv, ">=", 60))
        four = [sc[t][0] for t in SCBENCH if t in sc]
        print(target(f"{sub} mean of four", mean(four) if len(four) == 4 else None, ">=", 40))
        rand_kv = sc_rand.get("kv", (None,))[0]
        share = 100 * rand_kv / kv if kv and rand_kv is not None else None
        print(target(f"{sub} random p=0.1 kv, % of full cache's", share, "<=", 50))


if __name__ == "__main__":
    main()
