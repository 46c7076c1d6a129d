"""GateSight's stages of ``kvbench paper`` and the command itself (registered in :data:`kvbench.commands.COMMANDS` as
``paper``): label grids run :func:`~kvbench.methods.gatesight.labels.label_corpus` on a generated corpus (seeded
apart from the shipped calibration corpus) or ``--corpus``, then write Figure 1's half-life statistics; eval grids
run :func:`~kvbench.methods.gatesight.evaluate.evaluate_labels` (leave-one-corpus-out, or the trained estimator).
Everything else of the command is the core's :mod:`kvbench.paper`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress

from kvbench.atomic import write_atomic
from kvbench.paper.artifacts import Grid
from kvbench.paper.cli import paper
from kvbench.paper.stages import grid_paths, half_life_stats, register_stage

__all__ = ["app", "dynamics"]

#: label corpora: seeds apart from the shipped calibration corpus (seed 0), so the documents are held out
CORPUS_SEED = {"short": 1, "2k": 2}


def _labels_grid(grid: Grid, model: str, out: Path, opts: dict, bar: Progress, console: Console) -> None:
    from kvbench.models import load_model
    from kvbench.tasks.calibration_corpus import write_calibration_corpus

    from .labels import label_corpus
    from .utility import LabelConfig

    target = grid_paths(out, grid, model)
    corpus = opts.get("corpus")
    if corpus is None:
        corpus = out / "gatesight" / f"corpus-{grid.label_set}"
        if not corpus.exists():
            write_calibration_corpus(
                corpus,
                n_docs=grid.docs_per_kind or 4,
                n_chars=6 * grid.max_doc_tokens,
                seed=CORPUS_SEED.get(grid.label_set, 3),
            )
    lm = load_model(model, device=opts.get("device", "cpu"), dtype=opts.get("dtype"))
    config = LabelConfig(max_doc_tokens=grid.max_doc_tokens)
    label_corpus(
        lm.model,
        lm.tokenizer,
        corpus,
        target,
        config,
        fingerprint=lm.fingerprint,
        model_name=lm.name,
        model_source=lm.source,
        progress=True,
        console=console,
    )
    write_atomic(target.parent / f"dynamics-{grid.label_set}.json", json.dumps(dynamics(target), indent=1))


def _eval_grid(grid: Grid, model: str, out: Path, opts: dict, bar: Progress, console: Console) -> None:
    path = grid_paths(out, grid, model)
    if path.exists():
        return
    from kvbench.artifacts import find_calibration

    from .estimator import default_artifact_dir, load_artifact
    from .evaluate import EvalConfig, evaluate_labels
    from .labels import load_labels
    from .train import TrainConfig

    labels = load_labels(grid_paths(out, replace(grid, kind="labels"), model))
    est = None
    if grid.artifact:
        est = load_artifact(find_calibration(default_artifact_dir(labels.fingerprint)), labels.fingerprint)
    result = evaluate_labels(
        labels, EvalConfig(train=TrainConfig(window=grid.window)), artifact=est, progress=True, console=console
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(result.to_json(), indent=1))


def dynamics(labels_dir: Path) -> dict:
    """:func:`half_life_stats` of a label directory's documents (their recorded log-decays g)."""
    from .evaluate import half_lives
    from .labels import load_labels

    labels = load_labels(labels_dir)
    per_doc = [half_lives(d.load()["g"].double().mean(dim=1)).flatten().tolist() for d in labels.docs]
    stats = half_life_stats(per_doc)
    stats["gdn_layers"] = len(labels.manifest["gdn_layer_ids"])
    return stats


register_stage("labels", _labels_grid)
register_stage("eval", _eval_grid)


def _cells_grid(grid: Grid, model: str, out: Path, opts: dict, bar: Progress, console: Console) -> None:
    """The ``cells`` stage (Figures 6-7, Table 5's oracle, Figure 2c): :mod:`.paper_cells`, imported on use so
    ``kvbench paper --help`` loads no torch."""
    from .paper_cells import cells_grid

    cells_grid(grid, model, out, opts, bar, console)


register_stage("cells", _cells_grid)

app = typer.Typer(add_completion=False)
app.command("paper")(paper)
