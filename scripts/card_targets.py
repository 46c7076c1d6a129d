"""Print a model's card targets (issue 31) from the result rows of ``scripts/card_numbers.sh``.

Usage: ``python scripts/card_targets.py OUT [--before-1024 MEAN]`` where OUT holds the sub-directories
``ruler-full``, ``ruler-1024`` and ``scbench``. Each figure is the mean of per-question scores (0–100) of one
(bench, task, method, p) at the length the rows were run at; a target line says PASS or MISS and by how much.
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
    ap.add_argument("--before-1024", type=float, help="the five-task mean at 1,024 tokens before stages 8-9")
    args = ap.parse_args()
    full = read_scores(args.out / "ruler-full")
    r1024 = read_scores(args.out / "ruler-1024")
    scb = read_scores(args.out / "scbench")
    ruler = task_means(full, "ruler", "full", 1.0)
    ruler_rand = task_means(full, "ruler", "random", 0.1)
    print("RULER, full cache, at the model's length:")
    for task, (m, n) in ruler.items():
        print(f"  {task}: {m:.1f} ({n} items)")
    five = [ruler[t][0] for t in FIVE if t in ruler]
    r1 = task_means(r1024, "ruler", "full", 1.0)
    five_1024 = [r1[t][0] for t in FIVE if t in r1]
    sc = task_means(scb, "scbench", "full", 1.0)
    sc_rand = task_means(scb, "scbench", "random", 0.1)
    print("SCBench generated, full cache:", ", ".join(f"{t} {m:.1f} ({n} questions)" for t, (m, n) in sc.items()))
    print("targets:")
    print(target("RULER niah_single_1", ruler.get("niah_single_1", (None,))[0], ">=", 95))
    print(target("RULER five-task mean", mean(five) if len(five) == 5 else None, ">=", 45))
    print(target("SCBench kv", sc.get("kv", (None,))[0], ">=", 50))
    four = [sc[t][0] for t in SCBENCH if t in sc]
    print(target("SCBench mean of four", mean(four) if len(four) == 4 else None, ">=", 30))
    m1024 = mean(five_1024) if len(five_1024) == 5 else None
    if args.before_1024 is not None:
        print(target("1,024-token five-task mean", m1024, ">=", args.before_1024 - 5))
    else:
        print(f"  1,024-token five-task mean: {m1024 if m1024 is None else f'{m1024:.1f}'}")
    pairs = (("niah_single_1", ruler, ruler_rand, "niah_single_1"), ("SCBench kv", sc, sc_rand, "kv"))
    for name, fulls, rand, task in pairs:
        loss = fulls[task][0] - rand[task][0] if task in fulls and task in rand else None
        print(target(f"random p=0.1 loss on {name}", loss, ">=", 50))


if __name__ == "__main__":
    main()
