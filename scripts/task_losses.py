"""Mean supervised loss per task over windows of steps, from a training stage's log: how a running stage is
watched (which task's loss falls, which stays at the guessing level) without evaluating it.

Usage: .venv/bin/python scripts/task_losses.py RUN_DIR [--window 25]
RUN_DIR is a stage's output directory (its latest ``checkpoint-N/trainer_state.pt`` is read, or, once it has
finished, ``final/training_log.json``, whose entries of the last stage are shown). Each cell is the mean of the
per-row supervised losses of that task in the window and, in parentheses, how many rows of it were drawn.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere


def stage_log(run_dir: Path) -> list[dict]:
    """The log entries of the stage trained in ``run_dir``: its finished ``final/`` (the last stage's entries of
    the carried log) or its latest checkpoint's. Raises SystemExit naming the directory when it has neither."""
    final = run_dir / "final" / "training_log.json"
    if final.is_file():
        log = json.loads(final.read_text())
        last = max((e.get("stage", 1) for e in log), default=1)
        return [e for e in log if e.get("stage", 1) == last]
    import torch

    from kvbench_training.loop import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise SystemExit(f"{run_dir}: no final/training_log.json and no checkpoint-N/trainer_state.pt; give a run dir")
    return torch.load(ckpt / "trainer_state.pt", weights_only=False)["log"]


def windows(log: list[dict], size: int) -> tuple[list[str], list[tuple[str, dict[str, tuple[float, int]]]]]:
    """(tasks, rows): per window of ``size`` entries, its step range and task -> (mean loss, rows drawn)."""
    tasks = sorted({t for e in log for t in e.get("tasks", {})})
    rows = []
    for start in range(0, len(log), size):
        chunk = log[start : start + size]
        cells = {}
        for task in tasks:
            values = [e["tasks"][task] for e in chunk if task in e.get("tasks", {})]
            if values:
                cells[task] = (sum(values) / len(values), len(values))
        rows.append((f"{chunk[0]['step']}-{chunk[-1]['step']}", cells))
    return tasks, rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--window", type=int, default=25, help="steps per row of the table")
    args = ap.parse_args(argv)
    if args.window < 1:
        raise SystemExit(f"--window {args.window}: give at least 1 step")
    tasks, rows = windows(stage_log(args.run_dir), args.window)
    print("| steps | " + " | ".join(tasks) + " |")
    print("|---|" + "---:|" * len(tasks))
    for steps, cells in rows:
        print(
            f"| {steps} | "
            + " | ".join(f"{cells[t][0]:.3f} ({cells[t][1]})" if t in cells else "" for t in tasks)
            + " |"
        )


if __name__ == "__main__":
    main()
