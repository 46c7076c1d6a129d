"""What one ``kvbench run`` is asked (:class:`RunConfig`), the checks made before any model loads
(:func:`validate`, :func:`check_models`, :func:`check_threads`) and the plan they return: per method, the
allocations and kept fractions it scores (:class:`PlanEntry`). :class:`RunSummary` is what a run reports back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, Sequence

from kvbench import allocations, budgets
from kvbench.engines import ENGINES, engines_for
from kvbench.errors import KvbenchError
from kvbench.methods import REFERENCE, EvictionMethod, get_method, method_class
from kvbench.models import BUILTIN_MODELS, DEFAULT_LENGTH, LoadedModel, check_device, check_dtype
from kvbench.rows import P_DECIMALS
from kvbench.tasks import get_bench

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
    reference: bool = False  # also run methods.REFERENCE (no prune) when ``methods`` lacks it; ``kvbench run`` sets it


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
        raise KvbenchError(THREADS_BELOW_ONE.format(threads=config.threads))
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
    check_seed(config.seed)
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
        if alloc not in allocations.ALLOCATIONS:
            raise KvbenchError(f"unknown allocation {alloc!r}; valid allocations: {', '.join(allocations.ALLOCATIONS)}")
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


#: Contexts whose children answer together (:class:`AnswerPool`) unless ``--answer-contexts`` says otherwise.
ANSWER_CONTEXTS = 4


def resolve_defaults(config: RunConfig, lm: LoadedModel) -> RunConfig:
    """``config`` with the model-dependent defaults filled in: the model actually loaded and the prompt
    length (the model's stated context length, else ``DEFAULT_LENGTH``), as the manifest records them."""
    return replace(
        config,
        model=config.model or lm.name,
        length=config.length or lm.context_length or DEFAULT_LENGTH,
    )


def engine_dtype(config: RunConfig) -> str | None:
    """The dtype the model is loaded in: ``config.dtype``, unless the engine runs only some dtypes
    (``EngineBase.dtypes``; the vllm engine: bfloat16), then its default, and a ``--dtype`` it cannot run is
    refused. The model, fingerprint and artifacts are those of that dtype."""
    dtypes = ENGINES.get(config.engine).dtypes
    if dtypes is None:
        return config.dtype
    if config.dtype is not None and config.dtype not in dtypes:
        only = " / ".join(dtypes)
        raise KvbenchError(
            f"--engine {config.engine} runs {only} only; drop --dtype {config.dtype} or use --engine torch"
        )
    return config.dtype or dtypes[0]


#: ``--threads`` below 1 (:func:`validate` on the machine that plans, :func:`check_threads` where it runs).
THREADS_BELOW_ONE = "--threads {threads}: need at least 1 (or omit it for torch's default)"


def check_seed(seed: int) -> None:
    """Refuse a ``--seed`` outside ``[0, SEED_LIMIT)`` (``kvbench run``'s and ``kvbench train-tiny``'s)."""
    if not 0 <= seed < SEED_LIMIT:
        raise KvbenchError(f"--seed {seed}: need an integer from 0 to {SEED_LIMIT - 1} (2**32 - 1)")


def check_threads(threads: int | None) -> None:
    """Refuse ``--threads`` below 1, or beyond the CPU cores this process may use (torch would only run
    slower), on the machine that runs (a Ray worker checks its own; ``kvbench train-tiny`` too)."""
    from kvbench.cpu import local_cores

    if threads is not None and threads < 1:
        raise KvbenchError(THREADS_BELOW_ONE.format(threads=threads))
    if threads is not None and threads > local_cores():
        raise KvbenchError(
            f"--threads {threads} exceeds the {local_cores()} CPU cores this process may use, which only slows torch "
            f"down; use --threads {local_cores()} or fewer (or omit it)"
        )


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
