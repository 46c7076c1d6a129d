"""The runner's loop: per context, prefill once -> each method scores once -> each (allocation, p) forks a
child -> each question is answered from the child, scored, and appended as one row. A query-aware method
(``method.query_aware``, e.g. ``oracle``) scores once per question instead and forks per (question, p).
:func:`run_models` runs one configuration on several models, one after another.

Rows already in any results file of ``<out>`` are skipped (a context whose rows are all done is not even
prefilled), so rerunning an interrupted command resumes it. A row's identity (:class:`kvbench.rows.RowKey`)
includes the resolved length, the seed, the context's SHA-256 and the model fingerprint, so a run with
other settings never reuses it. ``shard=(i, N)`` keeps the contexts whose 0-based enumeration index ``c``
satisfies ``c % N == i`` (enumeration: tasks in bench order, then items) and writes its own results file
(:func:`kvbench.results.keys.results_name`), so the shards of one run may write one ``--out`` at the same time.

This module is the loop (:func:`run`, one context at a time); its parts live beside it in :mod:`kvbench.run`,
one idea each (the package's docstring names them).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import torch
from rich.console import Console
from rich.markup import escape

from kvbench import budgets
from kvbench.engines import ENGINES
from kvbench.engines.base import EngineBase
from kvbench.errors import KvbenchError
from kvbench.logs import make_console, make_progress
from kvbench.models import LoadedModel, load_model, max_positions
from kvbench.prompt import Rendered, render
from kvbench.results.store import ResultsStore
from kvbench.rows import P_DECIMALS
from kvbench.run.answer import fork_and_answer, memory_limit, run_query_aware, score_parent
from kvbench.run.artifacts import method_artifacts
from kvbench.run.manifest import manifest_entry
from kvbench.run.plan import (
    PlanEntry,
    RunConfig,
    RunSummary,
    check_models,
    check_threads,
    engine_dtype,
    resolve_defaults,
    validate,
)
from kvbench.run.pool import AnswerPool, pool_size
from kvbench.run.progress import ContextsBar
from kvbench.run.shards import shard_contexts
from kvbench.run.state import ParentContext, Pending, RunState, Unit
from kvbench.tasks import Context

__all__ = ["make_engine", "run", "run_models"]


def make_engine(engine: str, lm: LoadedModel, length: int, device: str = "cpu") -> EngineBase:
    """The engine named ``engine`` (the engines registry, :data:`kvbench.engines.ENGINES`) on ``lm``, for
    prompts of up to ``length`` tokens."""
    return ENGINES.get(engine)(lm, length, device)


def run(
    config: RunConfig,
    console: Console | None = None,
    lm: LoadedModel | None = None,
    on_progress: Callable[[RunSummary, int], None] | None = None,
) -> RunSummary:
    """Execute ``config``; rows go to ``config.out/results_name(config.shard)`` as they finish.

    Nothing is written before the first row: the results store is opened first (it locks the file and reads the
    directory) but writes lazily (:class:`~kvbench.results.ResultsStore`: the results file, a crash repair, the
    manifest and ``missing.json`` come with the first row; a store closed before it removes the lock file and
    the directories it created). So every check that can fail on the user's input (the configuration, the model
    and its weights, the artifacts, each task's data and first context, the first context's budgets, …)
    leaves ``--out`` exactly as it was. ``on_progress(summary, total)`` (optional) is called once the shard's
    ``total`` contexts are estimated and after each context (``total`` as far as known then:
    :class:`ShardContexts`)."""
    return _run_planned(config, validate(config), console, lm, on_progress)


def _run_planned(
    config: RunConfig,
    plan: list[PlanEntry],
    console: Console | None = None,
    lm: LoadedModel | None = None,
    on_progress: Callable[[RunSummary, int], None] | None = None,
) -> RunSummary:
    """``run`` of a configuration already validated into ``plan``."""
    console = console or make_console(stderr=True)
    engine_dtype(config)
    with ResultsStore(config.out, config.shard) as store:
        return _run_locked(config, console, lm, plan, store, on_progress)


def _run_locked(
    config: RunConfig,
    console: Console,
    lm: LoadedModel | None,
    plan: list[PlanEntry],
    store: ResultsStore,
    on_progress: Callable[[RunSummary, int], None] | None = None,
) -> RunSummary:
    """``run`` with the results file locked (and nothing written yet)."""
    summary = RunSummary(path=store.path)
    check_threads(config.threads)
    if config.threads:
        torch.set_num_threads(config.threads)
    if lm is None:  # an engine that loads the checkpoint itself needs no torch copy of its weights
        weights = ENGINES.get(config.engine).torch_weights
        lm = load_model(config.model, device=config.device, dtype=engine_dtype(config), weights=weights)
    config = resolve_defaults(config, lm)
    if config.length > max_positions(lm):
        raise KvbenchError(
            f"--length {config.length} exceeds the {max_positions(lm)} positions of model {lm.name}; "
            f"use --length <= {max_positions(lm)}"
        )
    if lm.random_weights:
        warning = f"model {lm.name} has RANDOM weights: its scores say nothing about the methods"
        console.print(warning, style="bold yellow", markup=False)
    artifacts = method_artifacts(plan, lm, store)  # each method reads its artifact now: absent -> nothing written
    for label, sha in artifacts.items():
        if sha is not None:
            console.print(f"{escape(label)} scores with the artifact of sha256 {sha[:16]}… (rows record it)")
    entry = {**manifest_entry(config, lm), "artifacts": artifacts}
    store.check_model(lm.name, lm.fingerprint)

    def record_missing(task: str, reason: str) -> None:  # with the first row, like everything written
        store.defer(lambda: store.record_missing(config.bench, task, reason))

    def say_recovered() -> None:  # the first append repaired a crash's last line (the message names the copy)
        if store.recovered:
            console.print(store.recovered, style="yellow", markup=False)

    with console.status(f"generating {escape(config.bench)} contexts …"):
        contexts = shard_contexts(config, lm, console, record_missing)  # each task's first one; the rest as rows go
    store.defer(lambda: store.write_manifest(entry))
    store.defer(say_recovered)
    engine = make_engine(config.engine, lm, config.length, config.device)
    if config.answer_batch is not None and config.answer_batch > 1 and not engine.batches_children:
        engine.close()
        raise KvbenchError(
            f"--answer-batch {config.answer_batch}: the {config.engine} engine answers one child at a time "
            f"({engine.batches_children_why}); drop --answer-batch or use --engine torch"
        )
    if on_progress:
        on_progress(summary, contexts.total)
    try:
        with make_progress(console) as progress:
            bar = ContextsBar(
                progress, progress.add_task("contexts", total=contexts.total), contexts, summary, on_progress
            )
            state = RunState(
                config=config,
                lm=lm,
                engine=engine,
                plan=plan,
                artifacts=artifacts,
                store=store,
                summary=summary,
                progress=progress,
                bar=bar.task,
            )
            with AnswerPool(state, pool_size(config, engine), bar.finished) as pool:
                for ctx in contexts:
                    bar.show(ctx)
                    if not _run_context(state, ctx, pool):
                        bar.finished(1)
                pool.flush()
            bar.end()
    except KeyboardInterrupt:
        console.print(
            f"[yellow]interrupted: {summary.rows_written} new rows are saved in {escape(str(store.path))}; rerun the "
            "same command to resume[/yellow]",
            soft_wrap=True,
        )
        raise
    finally:
        engine.close()  # before the next model of a --model list starts its engine
    summary.recovered = store.recovered
    return summary


def run_models(config: RunConfig, models: Sequence[str | None], console: Console | None = None) -> RunSummary:
    """``config`` once per model of ``models`` (None: the default model), one after another into the same
    ``config.out``: each model is loaded once and released before the next one loads. Rows are told apart by
    their ``model`` field; the manifest gets one entry per model. The configuration (:func:`validate`, once for
    every model: the plan names no model) and the list are checked before any model loads."""
    check_models(models)
    plan = validate(config)
    total = RunSummary()
    for name in models:
        summary = _run_planned(replace(config, model=name), plan, console)
        total.rows_written += summary.rows_written
        total.rows_skipped += summary.rows_skipped
        total.contexts += summary.contexts
        total.recovered = total.recovered or summary.recovered
        total.path = summary.path
    return total


def _pending(run: RunState, parent: ParentContext) -> Pending:
    """The rows of ``parent``'s context that no results file of the run's directory holds yet."""
    questions = parent.ctx.questions
    return {
        method.label: {
            (alloc, p): [
                qi
                for qi, q in enumerate(questions)
                if not run.store.is_done(run.key(parent, method, alloc, p, q.qid).to_dict())
            ]
            for alloc in allocs
            for p in ps
        }
        for method, allocs, ps in run.plan
    }


def _run_context(run: RunState, ctx: Context, pool: AnswerPool) -> bool:
    """Every pending row of ``ctx``: prefill it once, then per method score once and per (allocation, p) fork a
    child and answer (a query-aware method: :func:`run_query_aware`). A context without pending rows is not
    prefilled. When every child of the context fits in one batch, its children and parent go to ``pool``, which
    answers them together with other contexts' (True: its rows are written when the pool flushes)."""
    parent = ParentContext(ctx, render(run.lm.tokenizer, ctx, max_length=run.engine.max_context))
    _check_budgets(ctx, parent.rendered, run.plan)
    pending = _pending(run, parent)
    n_pending = sum(len(qs) for todo in pending.values() for qs in todo.values())
    run.summary.rows_skipped += (
        sum(len(ps) * len(allocs) * len(ctx.questions) for _, allocs, ps in run.plan) - n_pending
    )
    if n_pending == 0:
        return False
    rendered = parent.rendered
    session = run.engine.prefill(rendered.context_ids, rendered.prot, query_window=run.query_window)
    parent = replace(parent, session=session)
    batch = _batch_size(run, parent)
    rows = sum(len(qs) for m, _, _ in run.plan if not m.query_aware for qs in pending[m.label].values())
    pool_it = pool.enabled and rows <= batch  # every child, every question: one decode's rows
    pooled = False
    try:
        units: list[Unit] = []  # scored, not answered yet: answered as soon as a batch is full
        for method, _, _ in run.plan:
            todo = pending[method.label]
            if not any(todo.values()):
                continue
            if method.query_aware:
                run_query_aware(run, parent, method, todo, batch)
                continue
            run.say(f"{ctx.task} #{ctx.item} {method.name}: scoring")
            scored = score_parent(parent, method)
            units += [Unit(scored, alloc, p, questions) for (alloc, p), questions in todo.items() if questions]
            while len(units) >= batch and not pool_it:
                fork_and_answer(run, parent, units[:batch])
                units = units[batch:]
        if units and pool_it:
            pool.add(parent, units)
            pooled = True
        elif units:
            fork_and_answer(run, parent, units)
    finally:
        if not pooled:
            session.release()
    return pooled


def _batch_size(run: RunState, parent: ParentContext) -> int:
    """How many children of ``parent`` answer together: ``--answer-batch`` when given, else as many as the engine
    estimates fit in memory for the context's longest question and answer (:meth:`ParentSession.answer_batch_limit`)
    and it may hold live at once."""
    if run.config.answer_batch is not None:
        return run.config.answer_batch
    session = parent.session
    limit = memory_limit(parent)
    return max(1, min(limit, session.max_live_children or limit))


def _check_budgets(ctx: Context, rendered: Rendered, plan) -> None:
    """Refuse, before the context's rows, a p whose per-head budget ``round(p * (n - prot))`` keeps none of its
    evictable entries (only the protected prefix would stay), naming the smallest p that keeps one."""
    n, prot = len(rendered.context_ids), rendered.prot
    ps = sorted({p for _, _, method_ps in plan for p in method_ps})
    zero = [p for p in ps if n > prot and budgets.per_head_budget(n, prot, p) == 0]
    if zero:
        smallest = budgets.smallest_p(n - prot, P_DECIMALS)
        raise KvbenchError(
            f"--p {', '.join(map(str, zero))} keeps none of the {n - prot} evictable tokens of {ctx.bench}/{ctx.task} "
            f"item {ctx.item} (only its {prot}-token protected prefix); use --p {smallest} or more"
        )
