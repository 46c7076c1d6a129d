"""``kvbench train-tiny``: one training stage of the tiny hybrid, mounted by kvbench's command line through the
``kvbench.commands`` entry point of this distribution (``train-tiny = kvbench_training.cli:app``). Nothing heavy
is imported until the command runs, so ``kvbench train-tiny --help`` imports no torch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from kvbench.errors import KvbenchError
from kvbench.logs import make_console

__all__ = ["app", "train_tiny"]

err_console = make_console(stderr=True)

#: the typer app of one command, ``train-tiny`` (mounted as ``kvbench train-tiny``, not as a group)
app = typer.Typer(add_completion=False)


def _read_text_file(path: Path, option: str) -> str:
    """The UTF-8 text of a file named on the command line, or a KvbenchError naming the option."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise KvbenchError(f"{option} {path}: cannot read it ({exc})") from None


#: The shortest training row accepted (the shipped curriculum's first length; a row needs about 80 tokens to
#: hold every task of the default mix, measured with a 1,024-token vocabulary).
MIN_ROW_LENGTH = 128


def _check_numbers(**values: float) -> None:
    """Refuse a count below its floor (``--eval-limit`` 0, every other 1) or a learning rate that is not a
    positive finite number, naming the option."""
    for name, value in values.items():
        option = "--" + name.replace("_", "-")
        if name == "lr":
            if not (math.isfinite(value) and value > 0):
                raise KvbenchError(f"--lr {value}: need a positive learning rate, e.g. 3e-3")
            continue
        floor = 0 if name == "eval_limit" else 1
        if value < floor:
            raise KvbenchError(f"{option} {value}: need at least {floor}" + (" (0 skips the evaluation)" if floor == 0
                                                                              else ""))  # fmt: skip


def _max_positions(init: Path | None) -> int:
    """The positions of the model trained: the ``--init`` model's ``max_position_embeddings``, else the tiny
    config's."""
    import json

    import kvbench_training as T

    if init is not None:
        try:
            config = json.loads((init / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise KvbenchError(f"--init {init}: cannot read its config.json ({exc}); give a run's final/ dir") from None
        text = config.get("text_config") or {}
        return int(config.get("max_position_embeddings") or text.get("max_position_embeddings") or
                   T.SHIPPED_MAX_POSITIONS)  # fmt: skip
    return T.tiny_trained_config(2048).max_position_embeddings


def _parse_mix(text: str):
    """``--mix`` parsed (:func:`kvbench_training.parse_mix`), a weight that is not a finite number refused."""
    import kvbench_training as T

    mix = T.parse_mix(text)
    if not all(math.isfinite(w) for _, w in mix):
        raise KvbenchError(f"--mix {text!r}: weights must be finite numbers summing to 1")
    return mix


def _check_curriculum(stages, limit: int) -> None:
    """Refuse stage lengths outside ``[MIN_ROW_LENGTH, limit]`` or start fractions outside ``[0, 1)``."""
    for start, length in stages:
        if not MIN_ROW_LENGTH <= length <= limit:
            raise KvbenchError(f"--curriculum: row length {length} is outside {MIN_ROW_LENGTH} to {limit} (the model's "
                               "positions); give LENGTH@FRACTION stages within it")  # fmt: skip
        if not 0 <= start < 1:
            raise KvbenchError(f"--curriculum: start fraction {start} is outside [0, 1); e.g. 128@0,256@0.5")


@app.command("train-tiny")
def train_tiny(
    out: Path = typer.Option(Path("models/tiny-trained"), "--out", "-o", help="Output dir (checkpoints, final/)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimizer steps (default: 3,850, the shipped run)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Rows per step."),
    lr: float = typer.Option(3e-3, "--lr", help="Peak learning rate (warm-up + cosine)."),
    warmup: int = typer.Option(0, "--warmup", help="Linear warm-up steps (0: a twentieth of --steps)."),
    seed: int = typer.Option(0, "--seed", help="Training seed (RULER generator seeds >= 10000; evaluation uses 42)."),
    curriculum: Optional[str] = typer.Option(
        None, "--curriculum", help="LENGTH@START_FRACTION,… (default: 128@0,256@0.156,512@0.779,1024@0.961)."
    ),
    save_every: int = typer.Option(250, "--save-every", help="Checkpoint every N steps."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from the latest checkpoint."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads (1 on a busy machine)."),
    reference_gdn: bool = typer.Option(
        False, "--reference-gdn", help="transformers' GDN chunk kernel, not the faster one (same values to rounding)."
    ),
    autocast: bool = typer.Option(
        False,
        "--autocast",
        help="bf16 autocast of the forward, the loss in float32: faster only on a CPU with fast "
        "bf16 matmuls (AVX-512-BF16 / AMX); measure first: benchmarks/train_step.py --settings fast,autocast.",
    ),
    eval_limit: int = typer.Option(
        20, "--eval-limit", help="Items per task for the final full-cache RULER eval (0: skip)."
    ),
    export: Optional[Path] = typer.Option(
        None, "--export", help="Also write the shipped bf16 copy + model card here (e.g. kvbench/builtin/tiny-trained)."
    ),
    mix: Optional[str] = typer.Option(
        None, "--mix", help="Training mix TASK=WEIGHT,… summing to 1 (default: the shipped first stage's mix)."
    ),
    init: Optional[Path] = typer.Option(
        None, "--init", help="Start from this trained model (a run's final/ dir): a later training stage."
    ),
    card_note: Optional[Path] = typer.Option(
        None, "--card-note", help="Markdown file quoted in the exported model card below the accuracy table."
    ),
    arch: str = typer.Option(
        "qwen3_next", "--arch", help="qwen3_next (MoE, the shipped tiny-trained) | qwen3_5 (dense qwen3_5_text twin)."
    ),
    tokenizer_dir: Optional[Path] = typer.Option(
        None,
        "--tokenizer",
        help="Start from this tokenizer directory instead of training one (e.g. "
        "kvbench/builtin/tiny-trained, so a twin shares its tokenizer); a first stage only.",
    ),
) -> None:
    """Train the tiny hybrid (Qwen3-Next, GDN + gated attention) on RULER-style data; deterministic, resumable.
    The defaults are the shipped `tiny-trained` model's first stage; `bash scripts/train_tiny.sh` runs every stage."""
    import json

    import kvbench_training as T

    # every argument is checked before any work (no tokenizer trained, no model built, nothing written)
    steps = T.DEFAULT_STEPS if steps is None else steps
    _check_numbers(steps=steps, batch_size=batch_size, lr=lr, save_every=save_every, eval_limit=eval_limit)
    from kvbench.run.plan import check_seed, check_threads  # kvbench run's own checks of these options

    check_seed(seed)
    check_threads(threads)
    if card_note is not None and not export:
        raise KvbenchError("--card-note only applies to an export; add --export DIR")
    note = _read_text_file(card_note, "--card-note") if card_note is not None else ""
    if tokenizer_dir is not None:
        if init is not None:
            raise KvbenchError("--tokenizer applies to a first stage; a stage with --init keeps its model's tokenizer")
        if not (tokenizer_dir / "tokenizer.json").is_file():
            raise KvbenchError(f"--tokenizer {tokenizer_dir}: no tokenizer.json there; give a tokenizer directory")
    # a stage whose final/ is complete needs no --init (on a fresh machine the stage before it may be gone):
    # train() returns that final/ when its stored arguments match, and refuses it naming the difference otherwise
    finished = (out / "final" / "training_args.json").is_file()
    if init is not None and not finished and not (init / "config.json").is_file():
        raise KvbenchError(f"--init {init}: no trained model there (expected config.json; a run's final/ dir)")
    stages = T.parse_curriculum(curriculum) if curriculum else T.DEFAULT_CURRICULUM
    _check_curriculum(stages, _max_positions(out / "final" if finished else init))
    args = T.TrainArgs(
        steps=steps, batch_size=batch_size, lr=lr, seed=seed, curriculum=stages, warmup=warmup,
        save_every=save_every, mix=_parse_mix(mix) if mix else T.TASK_MIX, init=init, arch=arch,
        autocast=autocast,
    )  # fmt: skip
    from kvbench.atomic import check_writable

    check_writable(out, "--out")
    if export is not None:
        check_writable(export, "--export")
    tok = None
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    final = T.train(out, args, T.RunOptions(resume=resume, threads=threads, tokenizer=tok, reference_gdn=reference_gdn))
    err_console.print(f"[green]done:[/green] model in {escape(str(final))}")
    target = T.export_builtin(final, export, note=note) if export else final
    if eval_limit > 0:
        length = json.loads((final / "kvbench_builtin.json").read_text())["context_length"]
        scores = T.evaluate_quick(target, tasks=T.NO_EXTERNAL_DATA_TASKS, length=length, limit=eval_limit)
        for task, score in scores.items():
            err_console.print(f"{task:18} {score:.1f}")
        err_console.print(f"{'mean':18} {sum(scores.values()) / len(scores):.1f}")
        if export:
            T.export_builtin(final, export, evaluation=scores, note=note)
    if export:
        err_console.print(f"[green]exported:[/green] {escape(str(export))}")
