"""``kvbench run --ray``: one run's contexts split into N shards, each run by one Ray task.

Shard ``i`` of ``N`` is the runner's own ``--shard i/N`` (contexts ``c`` with ``c mod N = i``): one Ray task
per shard loads the model once and calls :func:`kvbench.run.loop.run` into the same ``--out``, so the results
store's rules (one writer per shard's results file, finished rows skipped) hold unchanged. A task whose worker
process dies (SIGKILL, out of memory, a lost node) is retried by Ray (``max_retries``) and resumes from the rows
its earlier attempt finished. Python exceptions are not retried: they repeat. Each task pushes its progress to
a small actor that the driver polls for one progress bar over all shards.

Without an address a local Ray is started (bound to 127.0.0.1, no dashboard, a small object store: only
configurations and summaries travel through it); ``auto``, ``host:port`` or ``ray://host:10001`` join a
cluster, where every node needs the same kvbench install and ``--out`` (and any ``--data-dir``, local
``--model`` directory, ``$KVBENCH_CACHE``) must be paths every node sees (a shared filesystem).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from kvbench.cpu import local_cores
from kvbench.errors import KvbenchError
from kvbench.logs import LineProgress, make_console, make_progress
from kvbench.run.plan import RunConfig, RunSummary

__all__ = ["RAY_INSTALL", "RayOptions", "RaySummary", "ShardProgress", "check_options", "run_ray", "shard_configs"]

RAY_INSTALL = 'pip install -e ".[ray]"'
LOCAL = "local"  # the address meaning "start a local Ray" (Ray's own spelling)
LOCAL_OBJECT_STORE_BYTES = 100 * 2**20  # Ray's minimum is 75 MiB; only configs and summaries go through it
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class RayOptions:
    """How ``--ray`` runs: ``address`` (``"local"``: start a local Ray), ``workers`` (= shards), GPUs reserved
    per worker, retries of a shard whose worker process died. The CPU cores reserved per worker are the run's
    ``--threads``, by default the local cores divided among the workers (a local Ray) or 1 (a cluster)."""

    address: str = LOCAL
    workers: int = 2
    gpus_per_worker: float = 0.0
    max_retries: int = 3


@dataclass
class ShardProgress:
    """What the driver knows of one shard: its current attempt's worker ``pid``, contexts ``done`` of ``total``
    (None until the shard has enumerated them), and how many attempts started (> 1: retried)."""

    attempts: int = 0
    attempt: str = ""
    pid: int | None = None
    done: int = 0
    total: int | None = None


@dataclass
class RaySummary(RunSummary):
    """The shards' summaries added up. A retried shard's last attempt counts the rows its earlier attempts
    wrote as already present. ``failed``: shard -> error, for shards that did not finish."""

    shards: int = 0
    retries: dict[int, int] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)


def import_ray() -> Any:
    """The ``ray`` module, or a KvbenchError naming the install."""
    try:
        import ray
    except ImportError:
        raise KvbenchError(f"--ray needs Ray, an optional extra: {RAY_INSTALL}") from None
    return ray


def check_options(config: RunConfig, options: RayOptions) -> None:
    """Refuse combinations that cannot mean what they say, before Ray starts."""
    if options.workers < 1:
        raise KvbenchError(f"--workers {options.workers}: need at least 1 worker")
    if options.gpus_per_worker < 0:
        raise KvbenchError(f"--gpus-per-worker {options.gpus_per_worker}: need 0 or more")
    if config.threads is not None and config.threads < 1:
        raise KvbenchError(f"--threads {config.threads}: need at least 1 CPU thread per worker")
    if options.gpus_per_worker > 1:
        raise KvbenchError(
            f"--gpus-per-worker {options.gpus_per_worker}: kvbench's engines compute on one GPU per worker today "
            "(tensor-parallel GPU vLLM is not wired yet), so the others would sit idle: use 1 or less"
        )
    if options.max_retries < 0:
        raise KvbenchError(f"max_retries {options.max_retries}: need 0 or more")
    if config.shard != (0, 1):
        raise KvbenchError("--ray makes the shards itself (one per worker): drop --shard")
    if options.gpus_per_worker > 0 and config.device == "cpu":
        raise KvbenchError(
            f"--gpus-per-worker {options.gpus_per_worker} with --device cpu would hold GPUs and compute on the CPU: "
            "add --device cuda"
        )
    if options.gpus_per_worker == 0 and config.device != "cpu":
        raise KvbenchError(
            f"--device {config.device} under --ray: give each worker its GPU(s) with --gpus-per-worker 1"
        )
    if config.device not in ("cpu", "cuda"):
        raise KvbenchError(
            f"--device {config.device} under --ray: use --device cuda (each worker sees only the GPUs Ray gave it)"
        )


def shard_configs(config: RunConfig, n: int) -> list[RunConfig]:
    """``config`` as ``n`` shards, paths made absolute (workers may run in another directory)."""
    model = config.model
    if model is not None and Path(model).exists():
        model = str(Path(model).resolve())
    base = replace(config, out=Path(config.out).resolve(), model=model)
    return [replace(base, shard=(i, n)) for i in range(n)]


def worker_env() -> dict[str, str]:
    """The driver's ``KVBENCH_*`` variables (data directory, cache), set in every worker as well."""
    return {k: v for k, v in os.environ.items() if k.startswith("KVBENCH_")}


class _ProgressHub:
    """A Ray actor: the shards' latest progress, pushed by the tasks, polled by the driver."""

    def __init__(self) -> None:
        self.shards: dict[int, ShardProgress] = {}
        self.seen: set[str] = set()

    def report(self, shard: int, attempt: str, pid: int, done: int, total: int | None) -> None:
        """The latest progress of ``shard``'s ``attempt`` (a late report of an earlier attempt is dropped)."""
        state = self.shards.setdefault(shard, ShardProgress())
        if attempt != state.attempt:
            if attempt in self.seen:
                return
            self.seen.add(attempt)
            state.attempts += 1
            state.attempt = attempt
        state.pid, state.done, state.total = pid, done, total

    def snapshot(self) -> dict[int, ShardProgress]:
        return dict(self.shards)


def _run_shard(config: RunConfig, hub: Any) -> RunSummary:
    """Body of a shard's Ray task: the runner on ``config`` (its shard set), progress pushed to ``hub``."""
    from kvbench.run.loop import run

    attempt, pid = uuid.uuid4().hex, os.getpid()
    shard = config.shard[0]
    hub.report.remote(shard, attempt, pid, 0, None)

    def report(summary: RunSummary, total: int) -> None:
        hub.report.remote(shard, attempt, pid, summary.contexts, total)

    return run(config, console=make_console(stderr=True), on_progress=report)


def _cause(exc: BaseException) -> BaseException:
    """The exception raised inside a Ray task (Ray wraps it in a RayTaskError)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters; under ``--debug`` (``KVBENCH_DEBUG``) the
    whole message, which for a worker's exception includes its remote traceback."""
    if os.environ.get("KVBENCH_DEBUG"):
        return f"{type(exc).__name__}: {exc}"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def _start(ray: Any, options: RayOptions, cpus: int) -> bool:
    """Connect to (or start) Ray; True when this call started or connected it (and so shuts it down)."""
    if ray.is_initialized():  # a program that set Ray up itself (tests, notebooks): use it as it is
        return False
    if options.address == LOCAL:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(
            address=LOCAL,
            num_cpus=max(local_cores(), cpus),
            include_dashboard=False,
            object_store_memory=LOCAL_OBJECT_STORE_BYTES,
            _node_ip_address="127.0.0.1",
        )
    else:
        try:
            ray.init(address=options.address)
        except ConnectionError as exc:
            raise KvbenchError(
                f"--ray {options.address}: no Ray cluster there ({exc}); start one with `ray start --head` "
                "or leave the address out for a local Ray"
            ) from None
    return True


def _cpus_per_worker(config: RunConfig, options: RayOptions) -> int:
    if config.threads:
        return config.threads
    return max(1, local_cores() // options.workers) if options.address == LOCAL else 1


def _warn_unschedulable(ray: Any, options: RayOptions, cpus: int, console: Console) -> None:
    """Say so when no node can hold one worker now (its tasks wait for a node, e.g. from an autoscaler)."""
    need = {"CPU": cpus, "GPU": options.gpus_per_worker}
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if not any(all(res.get(k, 0) >= v for k, v in need.items() if v) for res in nodes):
        console.print(
            f"[yellow]no node of this Ray cluster has {cpus} CPU(s) and {options.gpus_per_worker} GPU(s) for a "
            "worker: the shards wait until one joins (Ctrl-C stops)[/yellow]"
        )


def run_ray(
    config: RunConfig,
    options: RayOptions,
    console: Console | None = None,
    on_poll: Callable[[Mapping[int, ShardProgress]], None] | None = None,
) -> RaySummary:
    """Run ``config`` as ``options.workers`` shards on Ray; return their summaries added up.

    ``on_poll(progress)`` (optional) sees every shard's progress at each poll of the driver (about every
    0.5 s). Raises the KvbenchError of the first shard that hits one (a user error: the other shards are
    cancelled); other failures are returned in ``RaySummary.failed`` once the other shards finished."""
    from kvbench.models import BUILTIN_MODELS, DEFAULT_MODEL, materialize_builtin
    from kvbench.run import loop as runner

    console = console or make_console(stderr=True)
    check_options(config, options)
    runner.validate(config)  # bad input fails here, before Ray starts
    ray = import_ray()
    if (config.model or DEFAULT_MODEL) in BUILTIN_MODELS:
        materialize_builtin(config.model or DEFAULT_MODEL)  # once, not raced by the workers
    cpus = _cpus_per_worker(config, options)
    configs = shard_configs(replace(config, threads=cpus), options.workers)
    started = _start(ray, options, cpus)
    try:
        _warn_unschedulable(ray, options, cpus, console)
        hub = ray.remote(num_cpus=0, max_restarts=0)(_ProgressHub).remote()
        task = ray.remote(_run_shard).options(
            num_cpus=cpus,
            num_gpus=options.gpus_per_worker,
            max_retries=options.max_retries,
            retry_exceptions=False,
            **({"runtime_env": {"env_vars": worker_env()}} if worker_env() else {}),
        )
        refs = {task.remote(cfg, hub): cfg.shard[0] for cfg in configs}
        return _drive(ray, refs, hub, options, console, on_poll)
    finally:
        if started:
            ray.shutdown()


def _drive(ray, refs, hub, options: RayOptions, console: Console, on_poll) -> RaySummary:
    """Wait for the shard tasks, drawing one bar over all of them; gather their summaries."""
    n = options.workers
    results: dict[int, RunSummary] = {}
    failed: dict[int, str] = {}
    pending = list(refs)
    progress_state: dict[int, ShardProgress] = {}
    try:
        with make_progress(console) as progress:
            bar = progress.add_task(f"contexts ({n} shards)", total=None)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1, timeout=POLL_SECONDS)
                for ref in ready:
                    shard = refs[ref]
                    try:
                        results[shard] = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        cause = _cause(exc)
                        if isinstance(cause, KvbenchError):
                            for other in pending:
                                ray.cancel(other, force=True)
                            raise cause from None
                        failed[shard] = _one_line(cause)
                progress_state = ray.get(hub.snapshot.remote())
                _draw(progress, bar, progress_state, n, len(results) + len(failed))
                if on_poll:
                    on_poll(progress_state)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        console.print("[yellow]interrupted: the shards' finished rows are saved; rerun the same command to resume[/]")
        raise
    return _summarize(results, failed, progress_state, n)


def _draw(progress: Progress | LineProgress, bar, state: Mapping[int, ShardProgress], n: int, finished: int) -> None:
    totals = [s.total for s in state.values() if s.total is not None]
    known = len(totals) == n
    retried = sum(s.attempts - 1 for s in state.values() if s.attempts > 1)
    note = f", {retried} retried" if retried else ""
    if known:
        desc = f"contexts ({n} shards, {finished} finished{note})"
    else:
        desc = f"contexts ({len(totals)}/{n} shards listed{note})"
    progress.update(
        bar, description=desc, total=sum(totals) if known else None, completed=sum(s.done for s in state.values())
    )


def _summarize(
    results: Mapping[int, RunSummary], failed: Mapping[int, str], state: Mapping[int, ShardProgress], n: int
) -> RaySummary:
    out = RaySummary(shards=n, failed=dict(sorted(failed.items())))
    for shard in sorted(results):
        s = results[shard]
        out.rows_written += s.rows_written
        out.rows_skipped += s.rows_skipped
        out.contexts += s.contexts
        if s.recovered:
            out.recovered = "; ".join(filter(None, [out.recovered, f"shard {shard}: {s.recovered}"]))
    out.retries = {i: s.attempts - 1 for i, s in sorted(state.items()) if s.attempts > 1}
    return out


def describe(summary: RaySummary, out: Path) -> list[str]:
    """The final lines ``kvbench run --ray`` prints (rich markup; the path and errors escaped): the totals, then any
    retried or failed shard."""
    lines = [
        f"[green]done:[/green] {summary.rows_written} rows written, {summary.rows_skipped} already present, "
        f"{summary.contexts} contexts in {summary.shards - len(summary.failed)} of {summary.shards} shards -> "
        f"{escape(str(out))}"
    ]
    for shard, n in summary.retries.items():
        lines.append(
            f"[yellow]shard {shard}/{summary.shards} was retried {n} time(s) (its worker died); rows of earlier "
            "attempts count as already present[/yellow]"
        )
    for shard, error in summary.failed.items():
        lines.append(
            f"[red]shard {shard}/{summary.shards} failed: {escape(error)}; its finished rows are kept, rerun the same "
            "command to resume it[/red]"
        )
    return lines
