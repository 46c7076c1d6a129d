"""GateSight's stages of ``kvbench paper`` (:data:`.stages.STAGES` imports this module when a plan runs one): label
grids run :func:`~kvbench.methods.gatesight.labels.label_corpus` on a generated corpus (seeded apart from the shipped
calibration corpus) or ``--corpus``, then write Figure 1's half-life statistics; eval grids run
:func:`~kvbench.methods.gatesight.evaluate.evaluate_labels` (leave-one-corpus-out, or the trained estimator). The
``cells`` stage is :mod:`.cells`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from kvbench.atomic import write_atomic
from kvbench.methods.gatesight.paper.artifacts import Grid, grid_paths
from kvbench.methods.gatesight.paper.halflife import half_life_stats

__all__ = ["calibrate_stage", "cells_stage", "dynamics", "eval_stage", "labels_stage"]

#: label corpora: seeds apart from the shipped calibration corpus (seed 0), so the documents are held out
CORPUS_SEED = {"short": 1, "2k": 2}


def labels_stage(grid: Grid, model: str, out: Path, opts: dict, bar: Progress, console: Console) -> None:
    from kvbench.models import load_model
    from kvbench.tasks.calibration_corpus import write_calibration_corpus

    from ..labels import label_corpus
    from ..utility import LabelConfig

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


def eval_stage(grid: Grid, model: str, out: Path, opts: dict, bar: Progress, console: Console) -> None:
    path = grid_paths(out, grid, model)
    if path.exists():
        return
    from kvbench.artifacts import find_calibration

    from ..estimator import default_artifact_dir, load_artifact
    from ..evaluate import EvalConfig, evaluate_labels
    from ..labels import load_labels
    from ..train import TrainConfig

    labels = load_labels(grid_paths(out, replace(grid, kind="labels"), model))
    est = None
    if grid.artifact:
        est = load_artifact(find_calibration(default_artifact_dir(labels.fingerprint)), labels.fingerprint)
    config = EvalConfig(train=TrainConfig(window=grid.window), age_control=grid.age_control)
    result = evaluate_labels(labels, config, artifact=est, progress=True, console=console)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(result.to_json(), indent=1))


def dynamics(labels_dir: Path) -> dict:
    """:func:`half_life_stats` of a label directory's documents (their recorded log-decays g)."""
    from ..evaluate import half_lives
    from ..labels import load_labels

    labels = load_labels(labels_dir)
    per_doc = [half_lives(d.load()["g"].double().mean(dim=1)).flatten().tolist() for d in labels.docs]
    stats = half_life_stats(per_doc)
    stats["gdn_layers"] = len(labels.manifest["gdn_layer_ids"])
    return stats


def cells_stage(grid: Grid, model: str, out: Path, opts: dict, bar: Progress, console: Console) -> None:
    """The ``cells`` stage (Figures 6-7, Table 5's oracle, Figure 2c): :mod:`.cells`, imported on use so
    ``kvbench paper --help`` loads no torch."""
    from .cells import cells_grid

    cells_grid(grid, model, out, opts, bar, console)


def calibrate_stage(grid: Grid, model: str, out: Path, opts: dict, bar: Progress, console: Console) -> None:
    """A hub model's offline calibration for one method, from ``--corpus`` (paper scale; the shipped models carry
    theirs): a method that declares a calibration step runs it (``kvbench calibrate METHOD``, into its default
    place); GateSight without one is labelled on the corpus (the ``labels-short`` recipe) and its estimator trained
    and saved where the method reads it (``kvbench gatesight label`` + ``train``). ``DIR/calibration/<model>/
    <method>.json`` records the artifact written, so a rerun skips it."""
    from kvbench.errors import KvbenchError

    method = grid.methods[0]
    marker = grid_paths(out, grid, model)
    if marker.exists():
        done = json.loads(marker.read_text(encoding="utf-8"))
        if Path(done.get("artifact", "")).exists():
            return
    corpus = opts.get("corpus")
    if corpus is None:
        raise KvbenchError(f"calibrating {method} for {model} needs --corpus DIR (the paper's label corpus)")
    from kvbench.methods import method_class
    from kvbench.models import load_model

    cls = method_class(method)
    lm = load_model(model, device=opts.get("device", "cpu"), dtype=opts.get("dtype"))
    if cls.has_calibration():
        from kvbench.corpus import read_corpus, round_robin

        texts = [doc.text for doc in round_robin(read_corpus(corpus))]
        path = cls.calibrate(lm, texts, max_tokens=grid.max_doc_tokens or 32768, out=None)
    else:  # GateSight's own recipe: label the corpus, train on every document
        from ..estimator import default_artifact_dir, save_artifact
        from ..labels import load_labels
        from ..train import TrainConfig, train_from_labels

        labels = replace(grid, kind="labels", label_set="short", max_doc_tokens=1250, docs_per_kind=None)
        labels_stage(labels, model, out, opts, bar, console)  # resumes: labelled documents are skipped
        labels_dir = grid_paths(out, labels, model)
        config = TrainConfig(window=grid.window)
        est = train_from_labels(load_labels(labels_dir), config, progress=True, console=console)
        path = save_artifact(est, default_artifact_dir(lm.fingerprint))
    marker.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(marker, json.dumps({"method": method, "model": lm.name, "artifact": str(path)}, indent=1))
