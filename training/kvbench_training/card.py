"""The model card of a trained model (``MODEL_CARD.md``), from its training arguments, log and evaluation."""

from __future__ import annotations

from kvbench_training.data import EVAL_SEED, TASK_MIX, TRAIN_SEED_BASE
from kvbench_training.model import ARCHS, SHIPPED_MAX_POSITIONS, arch_of

#: architecture key -> (model family, MLP description) as the card names them; ``{width}``: the dense MLP's
_ARCHITECTURE = {
    "qwen3_next": ("Qwen3-Next (`qwen3_next`)", "MoE MLP (4 experts, top-2, shared expert)"),
    "qwen3_5": ("Qwen3.5 (`qwen3_5_text`)", "dense MLP ({width} wide)"),
}


def training_stages(args: dict) -> list[dict]:
    """The arguments of every training stage of a model, first stage first (``args``: a
    ``training_args.json``; a later stage holds its predecessor's under ``previous``)."""
    stages = []
    while args is not None:
        stages.append({k: v for k, v in args.items() if k != "previous"})
        args = args.get("previous")
    return stages[::-1]


def stage_compute_seconds(args: dict, log: list[dict]) -> list[float]:
    """Training compute per stage (seconds, first stage first), from the log alone: each step's row tokens
    (the stage's ``batch_size`` x the step's padded row length ``len``) over the throughput logged at that step
    (``tok_s``: tokens per second since the run (re)started, so a resumed stage is counted once, not its wait).
    On a machine shared with other work the throughput, and so this, is what that machine gave."""
    stages = training_stages(args)
    seconds = [0.0] * len(stages)
    for entry in log:
        i = entry.get("stage", 1) - 1
        seconds[i] += stages[i]["batch_size"] * entry["len"] / entry["tok_s"]
    return seconds


def compute_sentence(args: dict, log: list[dict]) -> str:
    """The model card's training-time sentence, from :func:`stage_compute_seconds`."""
    per_stage = stage_compute_seconds(args, log)
    minutes = ", ".join(f"{s / 60:.0f}" for s in per_stage)
    return (
        "Training time, by the log (each step's row tokens over the throughput logged at it; waits between "
        f"resumed runs excluded): {sum(per_stage) / 3600:.1f} hours (minutes per stage: {minutes})."
    )


def _scbench_sentence(stages: list[dict]) -> str:
    """The card's sentence on SCBench rows, when a stage's mix has any (empty otherwise)."""
    if not any(t.startswith("scbench_") for st in stages for t, _ in st.get("mix", TASK_MIX)):
        return ""
    return (
        ' "scbench_*" rows are SCBench\'s offline-generated tasks (kv, mf, prefix_suffix, vt) rendered as evaluation'
        " renders them (SCBench's assembly), the context followed by all of its questions, each answered (loss on"
        " the answers)."
    )


def _describe_stage(i: int, st: dict) -> str:
    """One bullet of the card's stage list (``i``: 0-based stage index, ``st``: its arguments)."""
    rows = ", ".join(f"{n} tokens from step {int(f * st['steps'])}" for f, n in st["curriculum"])
    mix = ", ".join(f"{t} {w:.0%}" for t, w in st.get("mix", TASK_MIX))
    start = "from scratch" if i == 0 else "from the previous stage's weights, fresh optimizer"
    return (
        f"Stage {i + 1} ({start}, seed {st['seed']}): {st['steps']} AdamW steps of {st['batch_size']} rows, "
        f"lr {st['lr']} (warm-up + cosine to 10 %, grad clip 1.0); rows of {rows}; mix: {mix}."
    )


def model_card(model, tokenizer, args: dict, log: list[dict], evaluation: dict[str, float], note: str = "") -> str:
    """The model card (markdown): what the model is, what it was trained on, its context length, measured
    accuracy, and what it is and is not for. ``args``/``log``: the model's ``training_args.json`` and
    ``training_log.json``; ``evaluation``: ``{task: accuracy in %}``; ``note``: quoted below the table."""
    n_params = sum(p.numel() for p in model.parameters())
    lengths = [e["len"] for e in log]
    last = log[-min(len(log), 50) :]
    final_loss = sum(e["loss"] for e in last) / max(len(last), 1)
    stages = training_stages(args)
    tokens = sum(e["len"] * stages[e.get("stage", 1) - 1]["batch_size"] for e in log)  # each stage's own batch size
    stage_text = "\n".join(f"- {_describe_stage(i, st)}" for i, st in enumerate(stages))
    evals = "\n".join(f"| {t} | {v:.1f} |" for t, v in evaluation.items()) or "| (not measured) | |"
    ctx_len = max(lengths) if lengths else 0
    arch = arch_of(model.config)
    family, mlp = _ARCHITECTURE[arch]
    mlp = mlp.format(width=getattr(model.config, "intermediate_size", None))
    return f"""# {ARCHS[arch]}: a tiny trained hybrid for kvbench

**What it is.** A {n_params / 1e6:.2f}M-parameter {family} causal LM: 12 layers, 3 Gated
DeltaNet : 1 gated attention (3 attention layers), {mlp}, linear head
dims 64, untied embeddings, partial RoPE 0.25; a byte-level BPE tokenizer with {len(tokenizer)} tokens (every
digit its own token) and a ChatML template. Shipped in bfloat16 (kvbench loads it as float32 on CPU).
Trained from scratch on a 2-core CPU by `kvbench train-tiny` (`training/`, the kvbench-training distribution).

**Trained on.** {len(log)} steps in all, about {tokens / 1e6:.1f}M row tokens (padding included), in
{len(stages)} stage(s):

{stage_text}

All data is generated by kvbench's own code with generator seeds >= {TRAIN_SEED_BASE} (RULER evaluation uses
seed {EVAL_SEED}). RULER rows are rendered exactly as kvbench renders evaluation prompts (chat template,
answer prefix) with the loss on the answer; "recall" rows are needles in RULER's wording followed by every
needle's question and answer, "lookup" rows the same with each question's needle drawn with replacement,
"echo" rows lookup rows whose questions repeat the needle's own wording up to the value,
"chains" rows are variable-assignment chains with vt's question for each,
"repeat" rows are a synthetic text segment written twice (loss on the answers / the second copy, and
{args["lm_weight"]} on every other token).{_scbench_sentence(stages)} The model never saw essay text (the Paul
Graham haystack of niah_single_2/3, niah_multikey_1, niah_multivalue, niah_multiquery) or the qa tasks.
Mean loss over the last 50 steps: {final_loss:.4f}. {compute_sentence(args, log)}

**Context length.** {ctx_len} tokens, the longest trained row. `kvbench run` uses it as the default
`--length` for this model. The config allows {SHIPPED_MAX_POSITIONS:,} positions so that cost benchmarks can time long
contexts on it, but nothing beyond the trained length was learned: accuracy there is not claimed.

**Accuracy at full cache** (RULER, kvbench's generator with seed {EVAL_SEED}, `--length` {ctx_len},
method `full`):

| task | accuracy (%) |
|---|---|
{evals}

{note}

**What it is for.** Smoke runs, CI and teaching: a small model that retrieves at full cache (see the
table for which tasks), so eviction methods visibly move the numbers offline, and whose gates and GDN
signals are trained rather than random (GateSight and TriAttention are calibrated for it; the artifacts ship in
`kvbench/builtin/calibration/`).

**What it is not for.** Research conclusions. It knows only synthetic RULER-style retrieval, a few million
tokens of it; how methods rank on it need not transfer to real LLMs.
"""
