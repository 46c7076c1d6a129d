"""Sharding: the contexts one shard of a run answers, drawn from the bench while the run consumes them
(:func:`shard_contexts`, :class:`ShardContexts`). Shard ``(i, N)`` keeps the contexts whose 0-based enumeration
index ``c`` satisfies ``c % N == i`` (enumeration: tasks in bench order, then items). A task that cannot run (its
data is absent, or ``--length`` cannot hold it) is said and recorded for ``missing.json``, or is an error when it
was asked for by name.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Sequence

from rich.console import Console

from kvbench.errors import KvbenchError, MissingDataError, TooShortError
from kvbench.models import LoadedModel, cache_dir
from kvbench.prompt import prompt_length
from kvbench.results.keys import ENDED_EARLY
from kvbench.run.plan import RunConfig
from kvbench.tasks import Context, get_bench

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
            if first is None:  # data without a usable item: never "0 contexts" and success
                raise MissingDataError(reason=f"{config.bench}/{task} gives no context: its data holds no usable item",
                                       fix=f"check the data that bench {config.bench} reads (a fetched file: remove "
                                       "it and fetch it again with `kvbench data fetch`)")  # fmt: skip
        except _CANNOT_RUN as exc:
            if config.tasks:  # asked for by name: its data or the user's --length is wrong for it
                raise _named(config, task, exc) from None
            errors[task] = exc
            continue
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
