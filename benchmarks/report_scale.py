"""Scale benchmark: `kvbench report` end to end on a paper-sized synthetic sweep.

2 models × (12 SCBench + 13 RULER tasks) × 100 items × 5 questions × 6 methods × 9 kept fractions, plus
``full`` at p = 1.0, an oracle ceiling on SCBench and GateSight's flat / pyramid allocations on six tasks:
about 1.4 M rows of the runner's shape (prediction, references, every scorer, bytes, seconds, meta), written
as 4 shards. Then ``kvbench report`` runs in a child process (10,000 bootstrap resamples, figures, HTML) and
this prints its wall seconds and peak resident memory against the budget (60 s, 4 GB); exit 1 past either. The
memory is the peak, sampled every 50 ms from /proc, of the resident bytes of the report process and every
process under it (its parsing workers) together: pages the workers share with the parent count twice, so it
is an upper bound.

    .venv/bin/python benchmarks/report_scale.py [--dir /tmp/kvbench-report-scale] [--keep] [--reuse] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

SCBENCH = ["kv", "prefix_suffix", "vt", "repoqa", "qa_eng", "qa_chn", "choice_eng", "many_shot", "summary", "mf",
           "repoqa_and_kv", "summary_with_needles"]  # fmt: skip
MIXED = {"repoqa_and_kv": ("repoqa", "kv"), "summary_with_needles": ("summary", "passkey")}
RULER = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
         "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"]  # fmt: skip
METHODS = {"random": "flat", "snapkv": "flat", "keydiff": "flat", "triattention": "flat", "kvzip": "global",
           "gatesight": "gate"}  # fmt: skip
PS = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
ABLATION_TASKS = {"kv", "qa_eng", "many_shot", "niah_single_1", "niah_multikey_2", "vt"}
#: the default allocation each method's rows record (its class attribute)
DEFAULTS = {**METHODS, "oracle": "gate"}
#: the calibration artifacts the synthetic rows record (the shipped model's have SHA-256 digests like these)
ARTIFACTS = {"gatesight": "5a" * 32, "triattention": "7c" * 32}
SKILL = {"random": 0.2, "snapkv": 0.55, "keydiff": 0.6, "triattention": 0.65, "kvzip": 0.75, "gatesight": 0.8,
         "oracle": 1.0, "full": 1.0}  # fmt: skip


def _scorer(bench: str, task: str, q: int) -> str:
    if bench == "ruler":
        return "string_match_all" if task.startswith(("niah_multi", "vt", "cwe", "fwe")) else "string_match_part"
    return f"scbench_{task}_{MIXED[task][q % 2]}" if task in MIXED else f"scbench_{task}"


def generate(out: Path, seed: int = 0, shards: int = 4) -> int:
    """Write the synthetic sweep under ``out`` (``results.shard-i-of-N.jsonl`` + manifest); return the row count."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    files = [open(out / f"results.shard-{i}-of-{shards}.jsonl", "w", encoding="utf-8") for i in range(shards)]
    n_rows = 0
    runs = []
    for model, fp in (("model-a", "a" * 64), ("model-b", "b" * 64)):
        runs.append({"model": model, "model_fingerprint": fp, "model_shape": {"n_attn_layers": 16, "n_kv_heads": 4,
                     "head_dim": 256, "dtype_bytes": 2, "weight_bytes": 54 * 10**9}})  # fmt: skip
        for bench, tasks in (("scbench", SCBENCH), ("ruler", RULER)):
            for t_i, task in enumerate(tasks):
                difficulty = rng.uniform(0.1, 0.9, size=100)
                plan = [("full", "flat", 1.0)] + [(m, a, p) for m, a in METHODS.items() for p in PS]
                if bench == "scbench":
                    plan += [("oracle", "flat", p) for p in PS]
                if task in ABLATION_TASKS:
                    plan += [("gatesight", a, p) for a in ("flat", "pyramid") for p in PS]
                for item in range(100):
                    sha = f"{t_i:04x}{item:060x}"
                    shard = files[(t_i * 100 + item) % shards]
                    lines = []
                    for method, alloc, p in plan:
                        keep = SKILL[method] + (1 - SKILL[method]) * p
                        for q in range(5):
                            scorer = _scorer(bench, task, q)
                            s = 100.0 * float(rng.random() < keep * (1 - 0.5 * difficulty[item]))
                            scores = {scorer: s}
                            if bench == "scbench":
                                scores[scorer + "_revised"] = s if task not in ("qa_chn", "choice_eng") else 100 - s
                            lines.append(json.dumps({
                                "model": model, "engine": "torch", "method": method, "allocation": alloc, "p": p,
                                "bench": bench, "task": task, "item": str(item), "question": str(q),
                                "prediction": "the answer is 12345 and some more generated words", "references":
                                ["12345"], "score": s, "scorer": scorer, "scores": scores, "real_fork": True,
                                "query_aware": method == "oracle", "kept_entries": int(64 * 4096 * p),
                                "full_entries": 64 * 4096, "stored_bytes": int(4096 * 65536 * p),
                                "full_bytes": 4096 * 65536, "padded": False, "n_context": 4096, "prot": 40,
                                "truncated_from": None, "context_sha256": sha, "prefill_s": 1.5,
                                "score_s": 3.0 if method == "kvzip" else 0.02, "fork_s": 0.001, "answer_s": 0.4,
                                "new_tokens": 12, "stopped": True, "seed": 42, "length": 4096,
                                "model_fingerprint": fp, "random_weights": False,
                                "artifact_sha256": ARTIFACTS.get(method),
                                "default_allocation": DEFAULTS.get(method, "flat"), "meta": {"id": item},
                            }))  # fmt: skip
                    shard.write("\n".join(lines) + "\n")
                    n_rows += len(lines)
    for f in files:
        f.close()
    (out / "manifest.json").write_text(json.dumps({"runs": runs}))
    return n_rows


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants now (Linux /proc; 0 for what has exited)."""
    total, todo = 0, [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * page
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def run_measured(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``cmd``; (its result, wall seconds, peak resident GB of it and its descendants together)."""
    peak = [0]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    sampler.join()
    own = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the largest single process, at least
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), wall, max(peak[0], own) / 1e9


def _current(res: Path) -> bool:
    """Whether kept results have today's row identity (rows of an older kvbench would be left out)."""
    from kvbench.results.keys import ROW_KEY

    first = next(iter(sorted(res.glob("*.jsonl"))), None)
    if first is None:
        return False
    with open(first, "rb") as fh:
        row = json.loads(fh.readline() or b"{}")
    return all(k in row for k in ROW_KEY)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/kvbench-report-scale"))
    ap.add_argument("--keep", action="store_true", help="keep the synthetic results and report")
    ap.add_argument("--reuse", action="store_true", help="time the report on --dir's kept results (from --keep)")
    ap.add_argument("--runs", type=int, default=1, help="report runs (the median is judged)")
    args = ap.parse_args()
    res, rep = args.dir / "results", args.dir / "report"
    if not (args.reuse and (res / "manifest.json").exists() and _current(res)):
        shutil.rmtree(args.dir, ignore_errors=True)
        start = time.perf_counter()
        n = generate(res)
        print(f"generated {n:,} rows in {time.perf_counter() - start:.1f} s")
    size = sum(p.stat().st_size for p in res.glob("*.jsonl"))
    print(f"results: {size / 1e6:,.0f} MB in {len(list(res.glob('*.jsonl')))} files")
    kvbench = Path(sys.executable).with_name("kvbench")
    walls, peaks = [], []
    for _ in range(args.runs):
        proc, wall, rss_gb = run_measured([str(kvbench), "report", "--results", str(res), "--out", str(rep)])
        if proc.returncode:
            print(proc.stderr[-3000:])
            return proc.returncode
        walls.append(wall)
        peaks.append(rss_gb)
        print(f"kvbench report: {wall:.1f} s wall, peak RSS {rss_gb:.2f} GB (all its processes), "
              f"{len(list((rep / 'tables').glob('*.csv')))} tables, {len(list((rep / 'figures').glob('*.png')))} "
              "figures")  # fmt: skip
    wall, rss_gb = statistics.median(walls), max(peaks)
    print(f"median {wall:.1f} s of {len(walls)} (budget 60), peak RSS {rss_gb:.2f} GB (budget 4)")
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)
    return 0 if wall <= 60 and rss_gb <= 4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
