"""``kvbench gatesight label | train | eval``: a typer app registered in :data:`kvbench.commands.COMMANDS` under
the name the method's class gives as ``commands``; ``kvbench`` imports it only when these commands are used.

Typical use::

    kvbench gatesight label --model M --corpus corpora/ --out labels/M
    kvbench gatesight train --labels labels/M            # -> $KVBENCH_CACHE/calibration/gatesight/<fp16>/
    kvbench gatesight eval  --labels labels/M --out reports/gatesight
    kvbench run --method gatesight --model M …

User errors (:class:`~kvbench.errors.KvbenchError`) print one message and exit with status 2, also where the app
runs on its own (``CliRunner().invoke(app, …)``); under ``kvbench --debug`` (``KVBENCH_DEBUG=1``) they are
re-raised with their traceback.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from kvbench import options
from kvbench.errors import KvbenchError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="GateSight: label future KV utility, train the per-head estimator, evaluate predictors (Table 5).",
)
console = Console(stderr=True, soft_wrap=True)


def _user_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KvbenchError as exc:
            if os.environ.get("KVBENCH_DEBUG", "0") not in ("", "0"):  # kvbench --debug: the traceback
                raise
            console.print(f"[bold red]error:[/bold red] {escape(str(exc))}")
            raise typer.Exit(2) from None

    return wrapper


@app.command()
@_user_errors
def label(
    *,
    model: str = typer.Option(..., "--model", help="Built-in model name, local directory or hub id."),
    corpus: Path = typer.Option(
        ..., "--corpus", help="Directory with one subdirectory per corpus of .txt/.md/.jsonl/.json documents."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Label directory (created; resumable)."),
    m: int = typer.Option(4, "--m", help="Continuations sampled per document."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="Tokens per continuation (at most)."),
    temperature: float = typer.Option(1.0, "--temperature"),
    top_p: float = typer.Option(0.95, "--top-p"),
    top_k: int = typer.Option(20, "--top-k"),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (combined with each document's id)."),
    max_doc_tokens: int = typer.Option(1250, "--max-doc-tokens", help="Documents are cut to this many tokens."),
    min_doc_tokens: int = typer.Option(16, "--min-doc-tokens", help="Shorter documents are skipped."),
    limit: Optional[int] = typer.Option(None, "--limit", "-n", help="Label at most this many documents."),
    check: bool = typer.Option(True, "--check/--no-check", help="Run the Appendix B checks on every document."),
    device: str = options.DEVICE,
    dtype: Optional[str] = options.DTYPE,
    threads: Optional[int] = options.THREADS,
) -> None:
    """Sample continuations of every document and label every KV entry with its future utility (Eq. 2)."""
    import torch

    from kvbench.models import load_model

    from .labels import label_corpus
    from .utility import LabelConfig

    if threads:
        torch.set_num_threads(threads)
    if m < 1 or max_new_tokens < 1:
        raise KvbenchError("--m and --max-new-tokens must be at least 1")
    config = LabelConfig(
        m=m,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        check=check,
        max_doc_tokens=max_doc_tokens,
        min_doc_tokens=min_doc_tokens,
    )
    lm = load_model(model, device=device, dtype=dtype)
    if lm.random_weights:
        warning = f"model {lm.name} has RANDOM weights: its labels only exercise the pipeline"
        console.print(warning, style="yellow", markup=False)
    summary = label_corpus(
        lm.model,
        lm.tokenizer,
        corpus,
        out,
        config,
        fingerprint=lm.fingerprint,
        model_name=lm.name,
        model_source=lm.source,
        limit=limit,
        console=console,
    )
    console.print(
        f"labelled {summary['labelled']} documents into {out} ({summary['skipped_existing']} already there, "
        f"{summary['skipped_short']} too short)",
        markup=False,
    )


def _train_config(*, window, epochs, lr, weight_decay, grad_clip, positions, batch_size, hidden, seed):
    from .train import TrainConfig

    if window < 0 or epochs < 1 or positions < 1 or batch_size < 1 or hidden < 1:
        raise KvbenchError("--window must be >= 0; --epochs, --positions, --batch-size, --hidden >= 1")
    return TrainConfig(
        window=window,
        hidden=hidden,
        lr=lr,
        weight_decay=weight_decay,
        grad_clip=grad_clip,
        epochs=epochs,
        positions_per_doc=positions,
        batch_size=batch_size,
        seed=seed,
    )


@app.command()
@_user_errors
def train(
    *,
    labels: Path = typer.Option(..., "--labels", "-l", help="Label directory from `kvbench gatesight label`."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Artifact directory (default: $KVBENCH_CACHE/calibration/gatesight/<fp16>/)."
    ),
    window: int = typer.Option(6, "--window", help="Preceding GDN layers read per attention layer."),
    epochs: int = typer.Option(12, "--epochs"),
    lr: float = typer.Option(2e-3, "--lr"),
    weight_decay: float = typer.Option(1e-2, "--weight-decay"),
    grad_clip: float = typer.Option(1.0, "--grad-clip", help="Gradient-norm clip per MLP (0: off)."),
    positions: int = typer.Option(500, "--positions", help="Random body positions per document."),
    batch_size: int = typer.Option(256, "--batch-size"),
    hidden: int = typer.Option(64, "--hidden", help="Hidden units per MLP."),
    seed: int = typer.Option(0, "--seed"),
    exclude_corpus: Optional[str] = typer.Option(None, "--exclude-corpus", help="Comma list of corpora to leave out."),
    threads: Optional[int] = options.THREADS,
) -> None:
    """Train the per-(layer, KV head) MLPs on a label directory and write the artifact."""
    import torch

    from .estimator import default_artifact_dir, save_artifact
    from .labels import load_labels
    from .train import train_from_labels

    if threads:
        torch.set_num_threads(threads)
    config = _train_config(
        window=window,
        epochs=epochs,
        lr=lr,
        weight_decay=weight_decay,
        grad_clip=grad_clip,
        positions=positions,
        batch_size=batch_size,
        hidden=hidden,
        seed=seed,
    )
    label_set = load_labels(labels)
    excluded = [c.strip() for c in (exclude_corpus or "").split(",") if c.strip()]
    unknown = sorted(set(excluded) - set(label_set.corpora))
    if unknown:
        raise KvbenchError(f"unknown corpora {unknown}; the labels have {', '.join(label_set.corpora)}")
    est = train_from_labels(label_set, config, exclude_corpora=excluded, progress=True, console=console)
    target = out or default_artifact_dir(label_set.fingerprint)
    save_artifact(est, target)
    gm = ", ".join(f"{x:.3f}" for x in est.gate_means.tolist())
    console.print(f"wrote the GateSight artifact to {target} (gate means: {gm})", markup=False)


@app.command("eval")
@_user_errors
def eval_(
    *,
    labels: Path = typer.Option(..., "--labels", "-l", help="Label directory from `kvbench gatesight label`."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write gatesight_eval.json and .md here."),
    artifact: Optional[Path] = typer.Option(
        None, "--artifact", help="Evaluate this trained artifact on every document instead of leave-one-corpus-out."
    ),
    slow_threshold: float = typer.Option(1000.0, "--slow-threshold", help="Slow-head median half-life (tokens)."),
    ridge_alpha: float = typer.Option(1.0, "--ridge-alpha"),
    age_control: bool = typer.Option(False, "--age-control/--no-age-control", help="Also the age-only MLP."),
    folds: int = typer.Option(5, "--folds", help="k-fold by document when the labels hold a single corpus."),
    window: int = typer.Option(6, "--window"),
    epochs: int = typer.Option(12, "--epochs"),
    lr: float = typer.Option(2e-3, "--lr"),
    weight_decay: float = typer.Option(1e-2, "--weight-decay"),
    grad_clip: float = typer.Option(1.0, "--grad-clip"),
    positions: int = typer.Option(500, "--positions"),
    batch_size: int = typer.Option(256, "--batch-size"),
    hidden: int = typer.Option(64, "--hidden"),
    seed: int = typer.Option(0, "--seed"),
    threads: Optional[int] = options.THREADS,
) -> None:
    """Table 5: untrained signals, ridge and the per-head MLP, leave-one-corpus-out."""
    import torch

    from .estimator import load_artifact
    from .evaluate import EvalConfig, evaluate_labels, render_markdown, render_rich, write_result
    from .labels import load_labels

    if threads:
        torch.set_num_threads(threads)
    config = EvalConfig(
        train=_train_config(
            window=window,
            epochs=epochs,
            lr=lr,
            weight_decay=weight_decay,
            grad_clip=grad_clip,
            positions=positions,
            batch_size=batch_size,
            hidden=hidden,
            seed=seed,
        ),
        slow_threshold=slow_threshold,
        ridge_alpha=ridge_alpha,
        age_control=age_control,
        seed=seed,
        folds=folds,
    )
    label_set = load_labels(labels)
    est = load_artifact(artifact, label_set.fingerprint) if artifact is not None else None
    result = evaluate_labels(label_set, config, artifact=est, progress=True, console=console)
    Console().print(render_rich(result))
    for note in result.notes:
        console.print(note, style="dim", markup=False)
    if out is not None:
        js, md = write_result(result, out)
        console.print(f"wrote {js} and {md}", markup=False)
    else:
        typer.echo(render_markdown(result))
