"""``kvbench`` command line: the core commands (run, list, report, cost, calibrate) and every registered one.

User errors (:class:`~kvbench.errors.KvbenchError`) print one clear message and exit with status 2,
without a traceback; ``--debug`` (``kvbench --debug COMMAND …``, also accepted after the command, or
``KVBENCH_DEBUG=1``) re-raises them with the traceback.

The core names no method, bench or trainer: every other command (a bench's ``ruler generate``, a method's
``gatesight …``, the trainer's ``train-tiny``, ``data fetch``, ``results upgrade``) is a typer app registered in
:data:`kvbench.commands.COMMANDS` (``kvbench <name> …``), mounted by :func:`main` as a group that imports the
app only when that group is used (``kvbench --help`` imports no torch, nor does ``kvbench <any command>
--help``); ``kvbench calibrate METHOD`` runs the calibration step of any registered method that declares one
(:meth:`EvictionMethod.calibrate`).
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Callable, Optional

import click
import typer
import typer.main
from rich.markup import escape
from typer.core import TyperGroup

from kvbench import options
from kvbench.allocations import ALLOCATIONS
from kvbench.checkpoints.shape import with_layers as shape_with_layers
from kvbench.errors import KvbenchError, os_error
from kvbench.logs import make_console, quiet_library_bars
from kvbench.methods import DEFAULT_METHODS, REPORT_DEFAULTS
from kvbench.options import hide_flag_placeholders
from kvbench.tasks import DEFAULT_BENCH


class CoreCommands(TyperGroup):
    """The ``kvbench`` group: a command of a distribution that is not installed (``train-tiny`` without
    kvbench-training) is one line naming the pip command that installs it, not click's "No such command"."""

    def get_command(self, ctx, cmd_name: str):
        found = super().get_command(ctx, cmd_name)
        if found is None:
            from kvbench.commands import MISSING_HINTS

            if cmd_name in MISSING_HINTS:
                raise KvbenchError(f"`kvbench {cmd_name}` is not installed here; install it with: "
                                   f"{MISSING_HINTS[cmd_name]}")  # fmt: skip
        return found


app = typer.Typer(
    cls=CoreCommands,
    add_completion=False,
    no_args_is_help=True,
    help="Query-agnostic KV-cache eviction benchmark for hybrid LLMs.",
)
hide_flag_placeholders()  # a flag's help row shows no "<bool>" value
console = make_console()
err_console = make_console(stderr=True)

#: the option and environment variable of debug mode: errors re-raised with their traceback
DEBUG_OPTION, DEBUG_ENV = "--debug", "KVBENCH_DEBUG"


@app.callback()
def _root(
    debug: bool = typer.Option(
        False,
        DEBUG_OPTION,
        help=f"Show an error's full traceback instead of one line (any command; also after the command, or "
        f"{DEBUG_ENV}=1).",
    ),
) -> None:
    """Query-agnostic KV-cache eviction benchmark for hybrid LLMs."""
    # main() reads --debug itself (it must know it when an error reaches it); here, before any command runs
    # (`kvbench CMD --help` too: the filter imports neither torch nor transformers), the kernel warning filter
    from kvbench.kernel_warnings import quiet_kernel_warnings

    quiet_kernel_warnings()


def _split(text: str | None) -> list[str] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    return items or None


def parse_ps(text: str) -> list[float]:
    """``"all"`` -> the nine fractions 0.9 … 0.1; otherwise a comma list of floats in (0, 1], no empty entry."""
    from kvbench.budgets import ALL_P, validate_p

    if text.strip() == "all":
        return list(ALL_P)
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or "" in items:
        raise KvbenchError(f"--p {text!r} has an empty entry; give fractions in (0, 1] like 0.5,0.1, or 'all'")
    return [validate_p(p) for p in items]


@app.command()
def run(
    *,
    method: str = typer.Option(",".join(DEFAULT_METHODS), "--method", "-m", help="Method name(s), comma separated."),
    bench: str = typer.Option(DEFAULT_BENCH, "--bench", "-b", help="Benchmark name."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="Task name(s), comma separated (default: all)."),
    p: str = typer.Option("all", "--p", help="Kept fraction(s) in (0, 1], comma separated, or 'all' (0.9 … 0.1)."),
    allocation: Optional[str] = typer.Option(
        None,
        "--allocation",
        "-a",
        metavar=f"[{'|'.join(ALLOCATIONS)}]",
        help="Allocation(s), comma separated (default: each method's own).",
    ),
    model: Optional[str] = typer.Option(
        None,
        "--model",
        help="Built-in model name(s), local directories or hub ids, comma separated, run one after another "
        "(default: tiny-trained).",
    ),
    engine: str = options.ENGINE,
    limit: int = typer.Option(100, "--limit", "-n", help="Items per task."),
    length: Optional[int] = typer.Option(
        None,
        "--length",
        help="Target prompt length in tokens for generated benches (default: the context length the model states, "
        "4096 for tiny-trained; 4096 for a model that states none).",
    ),
    seed: int = typer.Option(42, "--seed", help="Data and method seed (0 to 2**32 - 1)."),
    out: Path = typer.Option(Path("results/default"), "--out", "-o", help="Results directory."),
    shard: str = typer.Option("0/1", "--shard", help="Run shard i of N (0-based), e.g. 1/4."),
    device: str = options.DEVICE,
    dtype: Optional[str] = options.DTYPE,
    threads: Optional[int] = options.THREADS,
    answer_batch: Optional[int] = typer.Option(
        None,
        "--answer-batch",
        help="Children of a context answering a question together in one batched decode (torch engine): 1 "
        "answers each child alone; default: every child of the context that fits in a quarter of the free memory.",
    ),
    answer_contexts: Optional[int] = typer.Option(
        None,
        "--answer-contexts",
        help="Contexts whose children answer together in one batched decode (torch engine, without --answer-batch), "
        "fewer when the memory bound is reached; 1 answers each context's children on their own. Default 4.",
    ),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="External data directory (ruler/, scbench/); default $KVBENCH_DATA_DIR."
    ),
    verbose: bool = typer.Option(False, "--verbose", help="Show every library warning in full."),
    ray: Optional[str] = typer.Option(
        None,
        "--ray",
        metavar="[ADDRESS]",
        help="Run the contexts as --workers shards on Ray: alone, a local Ray; ADDRESS (auto, host:6379, "
        "ray://host:10001) joins a cluster. Needs the extra: pip install -e '.\\[ray]'.",
    ),
    workers: Optional[int] = typer.Option(None, "--workers", help="With --ray: shards run at once (default 2)."),
    gpus_per_worker: Optional[float] = typer.Option(
        None, "--gpus-per-worker", help="With --ray: GPUs Ray gives each worker (with --device cuda)."
    ),
    no_reference: bool = typer.Option(
        False,
        "--no-reference",
        help="Leave out the no-prune reference (method full: one child per context keeping everything) that every "
        "run adds so the report can show each method's drop from it.",
    ),
    shape_layers: Optional[int] = typer.Option(
        None,
        "--shape-layers",
        help="Layers of each shape:<hub id> twin in --model: 4 (one 3 GDN : 1 attention cycle, the default) or 8.",
    ),
    set_: list[str] = typer.Option(
        [],
        "--set",
        help="Method option METHOD.OPTION=VALUE (repeatable), e.g. triattention.zero_freq_bands=false; rows "
        "of a non-default option are labelled METHOD[OPTION=VALUE] (`kvbench list methods` shows the options).",
    ),
) -> None:
    """Prefill each context once, score with every method, fork at every p, answer every question."""
    from kvbench.kernel_warnings import quiet_kernel_warnings

    quiet_kernel_warnings().verbose = verbose
    if ray is None and (workers is not None or gpus_per_worker is not None):
        raise KvbenchError("--workers and --gpus-per-worker apply to --ray runs: add --ray")
    if data_dir is not None:
        if not data_dir.is_dir():
            raise KvbenchError(f"--data-dir {data_dir} is not a directory")
        os.environ["KVBENCH_DATA_DIR"] = str(data_dir.resolve())
    from kvbench.methods import parse_method_options
    from kvbench.run.loop import run_models
    from kvbench.run.plan import RunConfig, parse_shard

    config = RunConfig(
        methods=_split(method) or [],
        bench=bench,
        tasks=_split(task),
        ps=parse_ps(p),
        allocations=_split(allocation),
        model=None,
        engine=engine,
        limit=limit,
        length=length,
        seed=seed,
        out=out,
        shard=parse_shard(shard),
        device=device,
        dtype=dtype,
        threads=threads,
        method_options=parse_method_options(set_),
        answer_batch=answer_batch,
        answer_contexts=answer_contexts,
        reference=not no_reference,
    )
    models = _split(shape_with_layers(model, shape_layers)) or [None]
    if ray is not None:
        from dataclasses import replace

        from kvbench.distributed import RayOptions, describe, run_ray
        from kvbench.run.plan import check_models

        check_models(models)
        given = {"workers": workers, "gpus_per_worker": gpus_per_worker}
        options = RayOptions(address=ray, **{k: v for k, v in given.items() if v is not None})
        failed = False
        for name in models:  # one model after another, like a plain run
            ray_summary = run_ray(replace(config, model=name), options, console=err_console)
            for line in describe(ray_summary, out):  # markup of its own, user strings escaped
                err_console.print(line, soft_wrap=True)
            failed = failed or bool(ray_summary.failed)
        if failed:
            raise typer.Exit(1)
        return
    summary = run_models(config, models, console=err_console)
    err_console.print(
        f"[green]done:[/green] {summary.rows_written} rows written, {summary.rows_skipped} already present, "
        f"{summary.contexts} contexts -> {escape(str(summary.path))}",
        soft_wrap=True,
    )


class ListWhat(str, Enum):
    methods = "methods"
    benches = "benches"
    models = "models"
    allocations = "allocations"
    engines = "engines"
    scorers = "scorers"


@app.command("list")
def list_(
    what: Optional[ListWhat] = typer.Argument(
        None, help="methods | benches | models | allocations | engines | scorers (default: all of them)"
    ),
) -> None:
    """List what can be named on the command line (plugins included, each with where it comes from). A plugin
    that fails to load is named in one error line after the others are listed (exit status 2)."""
    from kvbench.registry import RegistryError

    broken: list[str] = []
    for kind in [what] if what is not None else list(ListWhat):
        if what is None:
            console.print(f"[bold]{kind.value}[/bold]")
        for show in _listing(kind):
            try:
                show()
            except RegistryError as exc:  # the rest is still listed
                broken.append(str(exc))
    if broken:
        raise KvbenchError(" | ".join(broken))


def _listing(what: ListWhat) -> list[Callable[[], None]]:
    """A function printing its lines for every entry of ``what``: the names read without importing any entry,
    each entry imported by its own call (so one broken plugin does not hide the rest)."""
    from kvbench.allocations import ALLOCATIONS
    from kvbench.engines import ENGINES
    from kvbench.methods import METHODS
    from kvbench.scorers import SCORERS
    from kvbench.tasks import BENCHES

    if what is ListWhat.models:
        return [_list_models]
    registry = {ListWhat.methods: METHODS, ListWhat.benches: BENCHES, ListWhat.allocations: ALLOCATIONS,
                ListWhat.engines: ENGINES, ListWhat.scorers: SCORERS}[what]  # fmt: skip
    names = sorted(registry.names()) if what in (ListWhat.methods, ListWhat.benches) else registry.names()
    return [lambda name=name: _list_entry(what, name, registry) for name in names]


def _list_models() -> None:
    from kvbench.models import BUILTIN_MODELS, DEFAULT_MODEL

    for name, spec in BUILTIN_MODELS.items():
        default = " (default)" if name == DEFAULT_MODEL else ""
        console.print(f"{name:22} {spec.description}{default}")
    console.print("or a local model directory / hub id of type qwen3_next, qwen3_5 or qwen3_5_text")


def _list_entry(what: ListWhat, name: str, registry) -> None:
    """The line(s) of entry ``name`` of ``registry`` (imported now), with where it comes from."""
    obj, source = registry.get(name), f"[dim]{registry.source(name)}[/dim]"
    if what is ListWhat.methods:
        console.print(f"{name:14} default allocation: {obj.default_allocation:8} {_first_line(obj)}  {source}")
        for option, help_ in sorted(obj.options.items()):
            console.print(f"{'':14} --set {name}.{option}=… (default {getattr(obj, option)!r}): {help_}")
    elif what is ListWhat.benches:
        from kvbench.tasks import get_bench

        b = get_bench(name)
        console.print(f"{name:14} tasks: {', '.join(b.tasks())}  {b.description}  {source}")
    elif what is ListWhat.engines:
        caps = ", ".join(sorted(obj.capabilities)) or "none"
        dtypes = " / ".join(obj.dtypes) if obj.dtypes else "any"
        console.print(f"{name:14} capabilities: {caps}; dtypes: {dtypes}  {source}")
    else:  # allocations, scorers
        console.print(f"{name:{14 if what is ListWhat.allocations else 24}} {_first_line(obj)}  {source}")


def _first_line(obj: object) -> str:
    """The first line of ``obj``'s docstring (a counts allocation: its function's), or ""."""
    obj = getattr(obj, "fn", obj)
    doc = getattr(obj, "__doc__", None) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def default_report_dir(results: Path) -> Path:
    """``kvbench report``'s default ``--out``: ``reports/<name of the results directory>`` relative to the current
    directory (``reports/report`` for a directory without a name, such as ``/``)."""
    return Path("reports") / (results.resolve().name or "report")


@app.command()
def report(
    *,
    results: str = typer.Option(
        "results/default", "--results", "-r", help="Results directory of a run; several comma separated merge."
    ),
    out: Optional[Path] = typer.Option(
        None,
        "--out",
        "-o",
        help="Report dir (index.html, report.md, tables/, figures/); default: reports/NAME in the current "
        "directory, NAME the first --results directory's name (a report never writes into a results directory).",
    ),
    reference: Optional[str] = typer.Option(
        None,
        "--reference",
        help=f"Method the confidence intervals compare to; default: {REPORT_DEFAULTS[0]} when the rows have it, else "
        "the method with the best mean over the pruned kept fractions (the report's notes say which).",
    ),
    compare: Optional[str] = typer.Option(
        None,
        "--compare",
        help=f"Method of the 'Every method against …' tables (scores and scoring time); default: {REPORT_DEFAULTS[1]} "
        "when the rows have it, else the CI reference (the report's notes say which).",
    ),
    cost_file: Optional[Path] = typer.Option(
        None, "--cost", help="`kvbench cost` output (default: cost.json in a results directory, when there)."
    ),
    gpu_memory: str = typer.Option("141GB", "--gpu-memory", help="Accelerator memory for the serving view."),
    serve_length: int = typer.Option(131072, "--serve-length", help="Context length (tokens) of the serving view."),
    resamples: int = typer.Option(10000, "--bootstrap", help="Bootstrap resamples of the confidence intervals."),
    seed: int = typer.Option(0, "--bootstrap-seed", help="Seed of the bootstrap resamples."),
) -> None:
    """Figures and tables of a run: printed compact tables, and a report directory (index.html, report.md, CSV,
    LaTeX, PNG, PDF) with curves, main table, paired bootstrap CIs, scorer sensitivity, every method against one
    (--compare), allocations, cost, memory. Reads the results directories only."""
    import json

    from kvbench.report import missing_lines, render_rich
    from kvbench.report import tables as T
    from kvbench.report.data import load, load_manifests, usable
    from kvbench.report.render import Options, build, choose_methods, write
    from kvbench.report.tables import parse_bytes
    from kvbench.report.terminal import choice_notes, print_report, reference_note

    dirs = [Path(d) for d in _split(results) or []]
    if not dirs:
        raise KvbenchError("--results needs a results directory, e.g. --results results/default")
    out = out or default_report_dir(dirs[0])
    if out.suffix == ".md":
        raise KvbenchError(f"--out {out}: give a report directory (report.md, index.html, … are written into it)")
    try:
        gpu_bytes = parse_bytes(gpu_memory)
    except ValueError as exc:
        raise KvbenchError(f"--gpu-memory {exc}") from None
    if serve_length < 1 or resamples < 100:
        raise KvbenchError("--serve-length needs >= 1 token and --bootstrap >= 100 resamples")
    cost_path = cost_file or next((d / "cost.json" for d in dirs if (d / "cost.json").exists()), None)
    cost_data = None
    if cost_path is not None:
        try:
            cost_data = json.loads(Path(cost_path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise KvbenchError(f"--cost {cost_path}: not a `kvbench cost` JSON file ({exc})") from None
    df, missing, notes = load(dirs)
    for note in notes:
        err_console.print(f"note: {note}", style="yellow", markup=False, soft_wrap=True)
    if df.empty:
        raise KvbenchError(
            f"no result rows in {', '.join(map(str, dirs))} (a run that stopped before its first row writes none): "
            f"run `kvbench run --out {dirs[0]}` first"
        )
    print_report(console, render_rich(df))  # a table wider than the console is printed whole, never squeezed
    defaults = REPORT_DEFAULTS  # the CI reference and comparison method when the rows have them
    options = Options(reference=reference, compare=compare, default_reference=defaults[0], default_compare=defaults[1],
                      n_resamples=resamples, seed=seed, gpu_bytes=gpu_bytes,
                      gpu_label=gpu_memory, serve_length=serve_length, cost=cost_data)  # fmt: skip
    built = build(df, missing, notes, load_manifests(dirs), options)
    # the terminal's notes: only what the user can act on, each naming its flag (report.md keeps build's notes)
    avg = T.averaged(T.task_scores(usable(df)))
    ref, cmp, _ = choose_methods(avg, options)
    for note in [reference_note(df), *choice_notes(avg, ref, cmp, reference, compare, defaults=defaults)]:
        if note:
            err_console.print(f"note: {note}", style="yellow", markup=False, soft_wrap=True)
    try:
        index = write(built, out)
    except OSError as exc:
        reason = exc.strerror or exc
        raise KvbenchError(f"cannot write the report into {out} ({reason}); choose another --out") from None
    for line in missing_lines(df, missing):
        console.print(line.replace("**", ""), style="yellow", markup=False)
    err_console.print(f"report written to {out / 'report.md'}; open {index}", markup=False, soft_wrap=True)


@app.command()
def cost(
    method: str = typer.Option(..., "--method", "-m", help="Method name(s), comma separated."),
    model: Optional[str] = typer.Option(
        None, "--model", help="Built-in model name, local directory or hub id (default: tiny-trained)."
    ),
    lengths: str = typer.Option("4096,16384", "--lengths", help="Context lengths in tokens, comma separated."),
    repeats: int = typer.Option(3, "--repeats", help="Measured rounds (median) after one warm-up."),
    out: Path = typer.Option(Path("results/cost.json"), "--out", "-o", help="JSON file for the table."),
    device: str = options.DEVICE,
    dtype: Optional[str] = options.DTYPE,
    threads: Optional[int] = options.THREADS,
    *,
    shape_layers: Optional[int] = typer.Option(None, "--shape-layers", help="Layers of a shape: twin (4 or 8)."),
) -> None:
    """Scoring cost: prefill seconds, scoring seconds and their ratio per method and context length."""
    import torch
    from rich.table import Table

    from kvbench.cost import measure_cost, save_cost
    from kvbench.engines.torch_engine import TorchEngine
    from kvbench.methods import method_class
    from kvbench.models import load_model

    names = _split(method) or []
    for name in names:
        method_class(name)
    try:
        ns = [int(x) for x in _split(lengths) or []]
    except ValueError:
        raise KvbenchError(f"--lengths {lengths!r} must be comma-separated integers") from None
    if not ns or min(ns) < 2 or repeats < 1:
        raise KvbenchError("--lengths needs integers >= 2 and --repeats >= 1")
    if threads is not None and threads < 1:
        raise KvbenchError(f"--threads {threads}: need at least 1 (or omit it for torch's default)")
    if threads:
        torch.set_num_threads(threads)
    lm = load_model(shape_with_layers(model, shape_layers), device=device, dtype=dtype)
    engine = TorchEngine(lm.model, lm.tokenizer, fingerprint=lm.fingerprint)
    too_long = [n for n in ns if n > engine.max_context]
    if too_long:
        raise KvbenchError(f"--lengths {too_long} exceed the model limit of {engine.max_context} tokens")
    rows = measure_cost(engine, names, ns, repeats)
    table = Table(title=f"scoring cost on {lm.name} (median of {repeats} after a warm-up)")
    for col in ("method", "length", "prefill s", "scoring s", "scoring / prefill"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r.method, str(r.length), f"{r.prefill_s:.3f}", f"{r.score_s:.4f}", f"{r.ratio:.4f}")
    console.print(table)
    if any(r.storage for r in rows):
        storage = Table(title="ragged allocations: child storage against the kept entries' bytes")
        for col in ("method", "length", "p", "stored / needed", "padded layout / needed"):
            storage.add_column(col, justify="right")
        for r in rows:
            for x in r.storage:
                storage.add_row(
                    r.method, str(r.length), f"{x.p}", f"{x.stored_over_needed:.4f}", f"{x.padded_over_needed:.4f}"
                )
        console.print(storage)
    meta = {"model": lm.name, "fingerprint": lm.fingerprint, "repeats": repeats, "threads": torch.get_num_threads()}
    err_console.print(f"written to {save_cost(rows, out, meta)}", markup=False)


@app.command()
def calibrate(
    method: str = typer.Argument(..., help="Method to calibrate: one that declares a calibration step."),
    model: Optional[str] = typer.Option(
        None, "--model", help="Built-in model name, local directory or hub id (default: tiny-trained)."
    ),
    corpus: Path = typer.Option(..., "--corpus", help="Text corpus: a file or directory of .txt/.md/.jsonl/.json."),
    max_tokens: int = typer.Option(32768, "--max-tokens", help="Calibration tokens in total."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Artifact path (default: the method's place for the model under $KVBENCH_CACHE)."
    ),
    device: str = options.DEVICE,
    dtype: Optional[str] = options.DTYPE,
) -> None:
    """Offline calibration of a method for a model (e.g. TriAttention's per-head query statistics), from a corpus
    whose documents are taken round-robin over its subdirectories (every kind is used before --max-tokens runs
    out). Any registered method that declares a calibration step can be named."""
    from kvbench.corpus import read_corpus, round_robin
    from kvbench.methods import list_methods, method_class
    from kvbench.models import load_model

    cls = method_class(method)
    if not cls.has_calibration():
        able = [name for name in list_methods() if method_class(name).has_calibration()]
        raise KvbenchError(
            f"method {method} has no calibration step; methods that have one: {', '.join(able) or 'none'}"
        )
    texts = [doc.text for doc in round_robin(read_corpus(corpus))]
    lm = load_model(model, device=device, dtype=dtype)
    path = cls.calibrate(lm, texts, max_tokens=max_tokens, out=out)
    made_from = cls.describe_calibration(path)
    err_console.print(
        f"calibrated {method} for {lm.name} -> {path}" + (f": {made_from}" if made_from else ""),
        markup=False,
        soft_wrap=True,
    )


def as_click(name: str, app: typer.Typer) -> click.Command:
    """The typer ``app`` registered as ``name``, as click runs it: the command itself when the app holds one
    command of that very name (``kvbench paper``, ``kvbench train-tiny``), else a group (``kvbench ruler
    generate``, even with ``generate`` its only command)."""
    commands = app.registered_commands
    if len(commands) == 1 and not app.registered_groups:
        info = commands[0]
        if (info.name or typer.main.get_command_name(info.callback.__name__)) == name:
            return typer.main.get_command(app)
    return typer.main.get_group(app)


class LazyCommands(TyperGroup):
    """The command registered in :data:`kvbench.commands.COMMANDS` under ``name``: listed by ``kvbench --help``
    with :func:`kvbench.commands.short_help` (no app imported); the typer app is imported (and turned into a
    click group, or a command for an app of one command) only when it is used, e.g. ``kvbench NAME --help`` or
    ``kvbench NAME COMMAND …``."""

    def __init__(self, name: str) -> None:
        from kvbench.commands import short_help

        listed = short_help(name) or f"Commands of {name} (`kvbench {name} --help` lists them)."
        super().__init__(name=name, help=listed)
        self._group: click.Command | None = None

    def load(self) -> click.Command:
        """The registered typer app as a click command (imported on first use)."""
        if self._group is None:
            from kvbench.commands import COMMANDS

            self._group = as_click(self.name, COMMANDS.get(self.name))
        return self._group

    def make_context(self, info_name, args, parent=None, **extra):  # the loaded group parses and runs
        return self.load().make_context(info_name, args, parent=parent, **extra)

    def list_commands(self, ctx) -> list[str]:  # a registered app of one command has no sub-commands
        loaded = self.load()
        return loaded.list_commands(ctx) if hasattr(loaded, "list_commands") else []

    def get_command(self, ctx, cmd_name: str):
        loaded = self.load()
        return loaded.get_command(ctx, cmd_name) if hasattr(loaded, "get_command") else None


def command_group() -> click.Command:
    """The whole command line as one click group: :data:`app` and a :class:`LazyCommands` group per
    :data:`kvbench.commands.COMMANDS` name (listed without importing any of them)."""
    from kvbench.commands import COMMANDS

    group = typer.main.get_command(app)
    for name in COMMANDS.names():
        if name in group.commands:
            from kvbench.registry import uninstall_command

            ep = COMMANDS.entry_point(name)
            fix = f": `{uninstall_command(ep)}` fixes it" if ep is not None else ""
            source = COMMANDS.source(name)
            raise KvbenchError(f"the commands {name!r} ({source}) clash with kvbench's own {name!r}{fix}")
        group.add_command(LazyCommands(name), name)
    return group


try:  # typer >= 0.2x parses options with its own copy of click, raising its own UsageError
    from typer._click.exceptions import UsageError as _TyperUsageError
except ImportError:  # older typer: click's
    _TyperUsageError = click.UsageError
USAGE_ERRORS = (click.UsageError, _TyperUsageError)


def _bare_option(args: list[str], option: str, value: str) -> list[str]:
    """``args`` with ``value`` after each ``option`` given without one (last, or followed by an option):
    ``--ray`` alone means ``--ray local`` (typer has no options with an optional value)."""
    out = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg == option and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append(value)
    return out


class _Sigterm:
    """While in use, SIGTERM stops the app as Ctrl-C does (a KeyboardInterrupt: a run keeps its rows and prints how
    to resume); :meth:`exit_code` then turns Ctrl-C's 130 into 143 (128 + SIGTERM)."""

    def __enter__(self) -> _Sigterm:
        self.received = False
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread: SIGTERM keeps its handler
            self._previous = None
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.received = True
        raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def exit_code(self, code: int) -> int:
        """``code``, or 143 for an interruption (130) that SIGTERM caused."""
        return 128 + signal.SIGTERM if self.received and code == 130 else code


def split_debug(args: list[str]) -> tuple[list[str], bool]:
    """``args`` without ``--debug`` wherever it stands before a ``--`` (``kvbench run --debug …`` as
    ``kvbench --debug run …``), and whether it was there or ``KVBENCH_DEBUG`` is set (not ``0``)."""
    end = args.index("--") if "--" in args else len(args)
    kept = [a for a in args[:end] if a != DEBUG_OPTION] + args[end:]
    return kept, len(kept) < len(args) or os.environ.get(DEBUG_ENV, "0") not in ("", "0")


@contextmanager
def _debug_env(debug: bool):
    """While in use, ``KVBENCH_DEBUG=1`` when ``debug`` (what a plugin's own error handling can read); the
    variable is restored afterwards."""
    before = os.environ.get(DEBUG_ENV)
    if debug:
        os.environ[DEBUG_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DEBUG_ENV, None)
        else:
            os.environ[DEBUG_ENV] = before


def _exit_site(exc: BaseException) -> str:
    """``file:line`` where ``exc`` was raised (its traceback's last frame)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else "code inside the command"


def main() -> None:
    """Console-script entry point: run the command line, turning user errors into one line and exit code 2
    (with ``--debug``: re-raised, so Python prints the traceback)."""
    quiet_library_bars()  # a log gets no tqdm redraws (kvbench's own progress: kvbench.logs)
    sys.argv[1:] = _bare_option(sys.argv[1:], "--ray", "local")  # the command a run's manifest records
    args, debug = split_debug(sys.argv[1:])
    try:
        with _debug_env(debug), _Sigterm() as sigterm:
            # standalone_mode=False: returns the exit code of an Exit (130 on Ctrl-C)
            code = command_group().main(args, prog_name="kvbench", standalone_mode=False)
    except (KvbenchError, OSError) as exc:  # an OS error no command turned into one line: its path and a fix
        if debug:
            raise
        # one line, never wrapped (an 80-column non-terminal stderr would cut it), markup in it kept literal
        message = str(os_error(exc) if isinstance(exc, OSError) else exc)
        err_console.print("[bold red]error:[/bold red] " + escape(message), soft_wrap=True)
        raise SystemExit(2) from None
    except SystemExit as exc:  # sys.exit() inside a command (a plugin's): never a silent success
        if debug or exc.code not in (0, None):
            raise
        err_console.print(f"[bold red]error:[/bold red] {escape(_exit_site(exc))} called sys.exit({exc.code!r}) before "
                          "the command finished; fix or uninstall the code there (--debug shows the traceback)",
                          soft_wrap=True)  # fmt: skip
        raise SystemExit(2) from None
    except (KeyboardInterrupt, click.exceptions.Abort):
        raise SystemExit(sigterm.exit_code(130)) from None
    except click.exceptions.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except USAGE_ERRORS as exc:  # one line too, naming where the valid usage is listed
        where = f"`{exc.ctx.command_path} --help`" if exc.ctx else "`kvbench --help`"
        err_console.print(f"[bold red]error:[/bold red] {escape(exc.format_message())} (see {where})", soft_wrap=True)
        raise SystemExit(exc.exit_code) from None
    except click.ClickException as exc:  # other click errors, shown as click would in standalone mode
        exc.show()
        raise SystemExit(exc.exit_code) from None
    if isinstance(code, int) and code:
        raise SystemExit(sigterm.exit_code(code))


if __name__ == "__main__":
    main()
