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


def read_rows(directory: Path) -> list[dict]:
    """Every result row of every ``results*.jsonl`` of ``directory``."""
    return [
        json.loads(line)
        for path in sorted(directory.glob("results*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def read_scores(directory: Path) -> dict[tuple[str, str, str, float, int], list[float]]:
    """Scores by (bench, task, method, p, length) from every ``results*.jsonl`` of ``directory``."""
    scores: dict[tuple[str, str, str, float, int], list[float]] = defaultdict(list)
    for row in read_rows(directory):
        scores[(row["bench"], row["task"], row["method"], float(row["p"]), int(row["length"]))].append(
            float(row["score"])
        )
    return scores


def task_means(scores: dict, bench: str, method: str, p: float) -> dict[str, tuple[float, int]]:
    """(mean, n) per task of one bench / method / p (one length per directory)."""
    return {
        task: (mean(v), len(v)) for (b, task, m, pp, _), v in sorted(scores.items()) if (b, m, pp) == (bench, method, p)
    }


METHODS = ("full", "random", "snapkv", "keydiff", "triattention", "kvzip", "gatesight", "oracle")


def _fmt(x: float) -> str:
    return f"{x:.1f}".removesuffix(".0")


def methods_table(directory: Path, title: str) -> str:
    """The Markdown table of docs/methods.md from one eviction directory's rows: a row per method (with its
    allocation), a column per task and the mean over tasks; cells "p = 0.5 / 0.1" (``full``: its one value)."""
    cells: dict[tuple[str, float, str], list[float]] = defaultdict(list)
    allocation: dict[str, str] = {}
    for row in read_rows(directory):
        cells[(row["method"], float(row["p"]), row["task"])].append(float(row["score"]))
        allocation[row["method"]] = row["allocation"]
    found = {t for _, _, t in cells}
    order = SCBENCH if found <= set(SCBENCH) else FIVE
    tasks = sorted(found, key=lambda t: (t not in order, order.index(t) if t in order else 0, t))
    ps = sorted({p for m, p, _ in cells if m != "full"}, reverse=True)
    lines = [f"| {title} | {' | '.join(tasks)} | mean |", "|---|" + "---:|" * (len(tasks) + 1)]
    for method in [m for m in METHODS if m in allocation] + sorted(set(allocation) - set(METHODS)):
        label = f"{method} [{allocation[method]}]" + (" (query-aware)" if method == "oracle" else "")
        per_p = [1.0] if method == "full" else ps
        columns = []
        for task in [*tasks, None]:
            values = []
            for p in per_p:
                if task is None:
                    means = [mean(cells[(method, p, t)]) for t in tasks if cells.get((method, p, t))]
                    values.append(_fmt(mean(means)) if len(means) == len(tasks) else "")
                else:
                    v = cells.get((method, p, task))
                    values.append(_fmt(mean(v)) if v else "")
            columns.append(" / ".join(values))
        lines.append(f"| {label} | {' | '.join(columns)} |")
    return "\n".join(lines)


def target(name: str, value: float | None, op: str, bound: float) -> str:
    if value is None:
        return f"  {name}: not measured (target {op} {bound:g})"
    ok = value >= bound if op == ">=" else value <= bound
    return f"  {name}: {value:.1f} (target {op} {bound:g}) {'PASS' if ok else f'MISS by {abs(value - bound):.1f}'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--before-1024", type=float, help="the five-task mean at 1,024 tokens before issue 44's stages")
    ap.add_argument(
        "--methods-table", metavar="TITLE", help="print docs/methods.md's tables (eviction, eviction-scbench)"
    )
    args = ap.parse_args()
    if args.methods_table:
        for sub in ("eviction", "eviction-scbench"):
            if (args.out / sub).is_dir():
                print(methods_table(args.out / sub, f"{args.methods_table}, {sub}"), end="\n\n")
        return
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
