"""The training loop: AdamW, warm-up + cosine, grad clip 1.0, length curriculum, checkpoints that resume exactly.

Loss. Rows are ``[prompt | answer | <|im_end|> | pad...]``. The loss weight is 1.0 on the answer tokens and
the closing ``<|im_end|>`` (``loss_mask``) and ``lm_weight`` (default 0.02) on the other non-pad tokens: a
little language modelling of the context keeps the representations of haystack text trained without
letting the (mostly predictable, repetitive) haystack dominate the gradient. Plain-text rows have weight
1.0 on every non-pad token. Padding is never in the loss (no attention mask needed; packing is impossible
without fla).

On disk (what a run resumes from, and what a later stage or the export reads):
``out_dir/checkpoint-<step>/`` holds the model (``save_pretrained``), the tokenizer and ``trainer_state.pt``
(step, AdamW state, torch and Python RNG states, the :class:`TrainArgs` as a dict, the loss log);
``out_dir/final/`` holds the float32 model, tokenizer, ``kvbench_builtin.json``, ``training_log.json`` and
``training_args.json`` (written last: its presence marks a finished run).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from kvbench.atomic import sha256_of, write_dir
from kvbench.cpu import local_cores
from kvbench.errors import KvbenchError
from kvbench_training import fast_gdn
from kvbench_training.data import DEFAULT_CURRICULUM, TASK_MIX, curriculum_length, make_batch
from kvbench_training.model import (
    ARCHS,
    arch_of,
    build_model,
    check_arch,
    load_trained,
    set_special_ids,
    tiny_trained_config,
)
from kvbench_training.tokenizer import train_tokenizer

DEFAULT_STEPS = 3850


@dataclass
class TrainArgs:
    """What defines a training run; stored as a dict in every checkpoint and in ``final/training_args.json``
    (the field order is the file's key order). ``curriculum`` and ``mix`` may be given as tuples (stored as
    lists of lists), ``init`` as a path (stored as a string), ``model_over`` as None (stored as ``{}``).
    Raises KvbenchError on a ``warmup`` outside ``[0, steps)`` or an unknown ``arch``."""

    steps: int  # optimizer steps
    batch_size: int  # rows per step
    lr: float  # peak learning rate
    seed: int
    curriculum: list = field(default_factory=lambda: [list(c) for c in DEFAULT_CURRICULUM])  # [[start, length]]
    warmup: int = 0  # linear warm-up steps; 0: 5 % of the steps (at least 1)
    weight_decay: float = 0.1
    lm_weight: float = 0.02  # loss weight of the unsupervised non-pad tokens
    save_every: int = 200  # checkpoint every N steps
    autocast: bool = False  # bf16 autocast on CPU
    vocab_size: int = 2048  # of a tokenizer trained for a first stage
    model_over: dict = field(default_factory=dict)  # tiny_trained_config overrides
    mix: list = field(default_factory=lambda: [list(m) for m in TASK_MIX])  # [[task, weight]]
    init: str | None = None  # a trained model directory the weights start from (a later training stage)
    arch: str = "qwen3_next"  # tiny_trained_config's architecture (ARCHS)

    def __post_init__(self) -> None:
        if not 0 <= self.warmup < self.steps:
            raise KvbenchError(
                f"--warmup {self.warmup}: must be at least 0 and below --steps ({self.steps}); 0 means steps // 20"
            )
        check_arch(self.arch)
        self.curriculum = [list(c) for c in self.curriculum]
        self.mix = [list(m) for m in self.mix]
        self.model_over = dict(self.model_over or {})
        self.init = str(self.init) if self.init is not None else None


@dataclass(frozen=True)
class RunOptions:
    """How this process runs a training (none of it is stored or changes the result)."""

    resume: bool = True  # continue from the latest checkpoint (or return a finished final/)
    progress: bool = True  # show a progress bar on the terminal
    stop_after: int | None = None  # end after this step with a checkpoint (how tests simulate an interruption)
    threads: int | None = None  # torch intra-op threads (None: torch's default)
    tokenizer: Any = None  # a ready tokenizer for a first stage (default: train_tokenizer(args.vocab_size))
    reference_gdn: bool = False  # transformers' GDN chunk kernel instead of kvbench_training.fast_gdn's


@dataclass
class _Run:
    """The state a training loop carries: model, tokenizer, optimizer, the first step to run, the log so far."""

    model: torch.nn.Module
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    start: int
    log: list[dict]


class _Step(NamedTuple):
    loss: float
    lr: float
    length: int  # row length, tokens
    gnorm: float
    tasks: dict[str, float]  # mean supervised loss per task
    tokens: int  # tokens in the batch, padding included


# --------------------------------------------------------------------------------------------------
# Loss and schedule


def loss_weights(input_ids: torch.Tensor, loss_mask: torch.Tensor, pad_id: int, lm_weight: float) -> torch.Tensor:
    """Per-token loss weights (``[B, T]`` like the inputs): 1 where ``loss_mask``, ``lm_weight`` on other
    non-pad tokens, 0 on pad."""
    real = (input_ids != pad_id).float()
    m = loss_mask.float()
    return m + lm_weight * real * (1 - m)


def batch_loss(
    model, input_ids: torch.Tensor, loss_mask: torch.Tensor, pad_id: int, lm_weight: float, autocast: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted next-token cross-entropy (target ``t+1`` weighted by the weight of token ``t+1``), and the
    per-row mean cross-entropy on the supervised tokens only (``[B]``, detached; NaN for a row without
    any), which is what training progress is judged by. Inputs ``[B, T]``."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=input_ids, use_cache=False).logits
    logits = logits[:, :-1].float()
    targets = input_ids[:, 1:]
    w = loss_weights(input_ids, loss_mask, pad_id, lm_weight)[:, 1:]
    # over [B * (T-1), vocab] rows: the softmax runs along contiguous memory (a [B, vocab, T-1] view does not)
    rows = logits.reshape(-1, logits.shape[-1])
    ce = torch.nn.functional.cross_entropy(rows, targets.reshape(-1), reduction="none").view(targets.shape)  # [B, T-1]
    loss = (ce * w).sum() / w.sum().clamp_min(1e-6)
    sup = loss_mask[:, 1:].float()
    row_ce = (ce.detach() * sup).sum(1) / sup.sum(1)
    return loss, row_ce


def task_losses(tasks: list[str], row_ce: torch.Tensor) -> dict[str, float]:
    """Mean supervised cross-entropy per task over the rows of one batch (NaN rows left out)."""
    out: dict[str, list[float]] = {}
    for task, value in zip(tasks, row_ce.tolist(), strict=True):
        if value == value:  # not NaN
            out.setdefault(task, []).append(value)
    return {t: round(sum(v) / len(v), 4) for t, v in sorted(out.items())}


def trim_padding(input_ids: torch.Tensor, loss_mask: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch (``[B, T]`` each) cut after its last column holding a real token of any row. Exact for
    :func:`batch_loss`: rows are right-padded, padding has loss weight 0 and the model is causal, so the loss
    and its gradients are unchanged; a step on short rows does less work (measured in
    ``benchmarks/train_step.py``)."""
    real = (input_ids != pad_id).any(0).nonzero()
    keep = int(real.max()) + 1 if real.numel() else input_ids.shape[1]
    return input_ids[:, :keep], loss_mask[:, :keep]


def lr_at(step: int, args: TrainArgs) -> float:
    """Learning rate of ``step``: linear warm-up to ``args.lr``, then cosine down to a tenth of it."""
    warm = args.warmup or max(1, args.steps // 20)
    if step < warm:
        return args.lr * (step + 1) / warm
    frac = (step - warm) / max(1, args.steps - warm)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def _ema_task_loss(log: list[dict], task: str, decay: float = 0.9) -> float:
    """Exponential moving average of one task's supervised loss over the log (NaN before it appears)."""
    ema = float("nan")
    for entry in log[-200:]:
        value = entry.get("tasks", {}).get(task)
        if value is not None:
            ema = value if ema != ema else decay * ema + (1 - decay) * value
    return ema


# --------------------------------------------------------------------------------------------------
# Checkpoints and finished runs


#: The file of a checkpoint listing every other file's size and sha256 (written last, inside the checkpoint).
CHECKPOINT_FILES = "checkpoint_files.json"


def _checkpoints(out_dir: str | Path) -> list[Path]:
    """The ``checkpoint-<step>`` directories of ``out_dir`` holding a ``trainer_state.pt``, latest step first."""
    found = [p for p in Path(out_dir).glob("checkpoint-*") if p.name.split("-", 1)[1].isdigit()]
    return sorted((p for p in found if (p / "trainer_state.pt").exists()), key=lambda p: -int(p.name.split("-")[1]))


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The complete ``checkpoint-<step>`` directory of ``out_dir`` with the highest step, or None."""
    ckpts = _checkpoints(out_dir)
    return ckpts[0] if ckpts else None


def checkpoint_damage(ckpt: Path) -> str | None:
    """Why checkpoint ``ckpt`` cannot be resumed from (a file missing, cut or changed), or None when it is
    whole. A checkpoint lists its files' sizes and sha256 in :data:`CHECKPOINT_FILES`; one written before
    that list existed is checked by reading its trainer state and its weights' header."""
    listing = ckpt / CHECKPOINT_FILES
    try:
        if listing.is_file():
            for name, (size, sha) in json.loads(listing.read_text(encoding="utf-8")).items():
                path = ckpt / name
                if not path.is_file():
                    return f"{name} is missing"
                if path.stat().st_size != size:
                    return f"{name} has {path.stat().st_size} bytes, not the {size} written"
                if sha256_of(path) != sha:
                    return f"{name} does not have the sha256 it was written with"
            return None
        from safetensors import safe_open

        torch.load(ckpt / "trainer_state.pt", weights_only=False, map_location="cpu")
        with safe_open(str(ckpt / "model.safetensors"), "pt"):
            pass
    except Exception as exc:  # OSError, a cut pickle or zip, a bad safetensors header, a bad listing
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return None


def _usable_checkpoint(out_dir: Path) -> Path | None:
    """:func:`latest_checkpoint` when it is whole (:func:`checkpoint_damage`); a damaged one is refused in one
    line naming what is wrong and the previous whole checkpoint to resume from (or, without one,
    ``--no-resume``)."""
    ckpts = _checkpoints(out_dir)
    if not ckpts:
        return None
    damage = checkpoint_damage(ckpts[0])
    if damage is not None:
        raise _damaged(ckpts[0], damage)
    return ckpts[0]


def _damaged(ckpt: Path, damage: str) -> KvbenchError:
    """The one-line refusal of damaged checkpoint ``ckpt``, naming the previous whole one (or the way out)."""
    previous = next((c for c in _checkpoints(ckpt.parent) if c != ckpt and checkpoint_damage(c) is None), None)
    fix = (f"the previous whole checkpoint is {previous}: remove {ckpt} to resume from it" if previous else
           f"no earlier checkpoint is whole: remove {ckpt}, or start over with --no-resume")  # fmt: skip
    return KvbenchError(f"checkpoint {ckpt} is damaged ({damage}); {fix}")


def remove_stale_writes(out_dir: Path) -> None:
    """Remove what a checkpoint write killed midway left in ``out_dir`` (:func:`kvbench.atomic.write_dir`'s
    ``.checkpoint-<step>.*.tmp`` folder), and put back a checkpoint that a kill left moved aside as
    ``.checkpoint-<step>.*.old`` while being replaced (removed when the new one made it into place)."""
    import shutil

    from kvbench.atomic import put_back

    for stale in sorted(out_dir.glob(".checkpoint-*.old")):
        target = out_dir / stale.name[1:].split(".", 1)[0]
        if target.exists():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            put_back(stale, target)
    for stale in out_dir.glob(".checkpoint-*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def _comparable_args(args: dict) -> dict:
    """A run's stored arguments (``trainer_state.pt`` or ``training_args.json``) in the form two runs compare
    by: ``save_every``, the carried ``previous`` stage and ``autocast`` left out (like the thread count, bf16
    autocast changes rounding, not the run: each log entry of a step taken under it says ``"bf16": true``),
    ``arch`` defaulted to ``qwen3_next`` (runs before it existed), and a JSON round trip so a
    ``training_args.json`` compares equal to live arguments."""
    args = {"arch": "qwen3_next", **json.loads(json.dumps(args))}
    return {k: v for k, v in args.items() if k not in ("save_every", "previous", "autocast")}


def _finished_run(out_dir: Path, args: TrainArgs) -> Path | None:
    """``out_dir/final`` when a run with these arguments has already finished there, else None.

    ``training_args.json`` is the last file :func:`save_final` writes, so its presence marks a complete
    ``final/``. This is what lets a stage's ``final/`` alone (no checkpoints: with the AdamW state a checkpoint
    is about three times the weights, 53 MB against 18 MB for the dense twin) carry a multi-stage run from one
    machine to the next."""
    final = out_dir / "final"
    if not (final / "training_args.json").is_file():
        return None
    saved = _comparable_args(json.loads((final / "training_args.json").read_text()))
    now = _comparable_args(asdict(args))
    if saved != now:
        raise KvbenchError(
            f"{final} was written with different training arguments: {saved} != {now}; "
            "remove that directory to train this stage again"
        )
    return final


def _optimizer(model: torch.nn.Module, args: TrainArgs) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices other than embeddings, none on the rest."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def _save_checkpoint(path: Path, run: _Run, step: int, args: TrainArgs) -> None:
    """Write ``path`` (beside it first, then renamed, so a kill leaves the previous checkpoints whole):
    model, tokenizer, ``trainer_state.pt`` (step, AdamW state, torch's, Python's and numpy's global RNG
    states, torch's thread count, arguments, log) and :data:`CHECKPOINT_FILES`, every file's size and sha256."""
    import numpy as np

    state = {
        "step": step,
        "optimizer": run.optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
        "threads": torch.get_num_threads(),
        "args": asdict(args),
        "log": run.log,
    }

    def write(tmp: Path) -> None:
        run.model.save_pretrained(tmp)
        run.tokenizer.save_pretrained(tmp)
        torch.save(state, tmp / "trainer_state.pt")
        files = {p.name: [p.stat().st_size, sha256_of(p)] for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / CHECKPOINT_FILES).write_text(json.dumps(files, indent=1), encoding="utf-8")

    write_dir(path, write)


def save_final(path: str | Path, model, tokenizer, args: TrainArgs, log: list[dict]) -> Path:
    """The trained model in float32: ``save_pretrained`` (safetensors), tokenizer, ``kvbench_builtin.json``,
    ``training_log.json`` (per step: loss, lr, row length, grad norm, tokens/s, supervised loss per task)
    and ``training_args.json``, written into a fresh folder that replaces ``path`` whole
    (:func:`kvbench.atomic.write_dir`)."""
    path = Path(path)
    model.eval()
    saved_args, full_log = asdict(args), [dict(e, stage=1) for e in log]
    if args.init is not None:  # a later stage: carry the earlier stages' arguments and log
        init = Path(args.init)
        saved_args["previous"] = json.loads((init / "training_args.json").read_text())
        earlier = [dict(e, stage=e.get("stage", 1)) for e in json.loads((init / "training_log.json").read_text())]
        stage = max(e["stage"] for e in earlier) + 1 if earlier else 1
        full_log = earlier + [dict(e, stage=stage) for e in log]
    lengths = [e["len"] for e in full_log]
    marker = {"name": ARCHS[args.arch], "random_weights": False, "context_length": max(lengths) if lengths else None}

    def write_final(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "kvbench_builtin.json").write_text(json.dumps(marker))
        (tmp / "training_log.json").write_text(json.dumps(full_log))
        (tmp / "training_args.json").write_text(json.dumps(saved_args, indent=1))

    write_dir(path, write_final)
    return path


# --------------------------------------------------------------------------------------------------
# Starting a run: from a checkpoint, from an earlier stage, or from scratch


def _resume(ckpt: Path, args: TrainArgs, threads: int | None = None) -> _Run:
    """The run saved in checkpoint ``ckpt``: weights, tokenizer, AdamW state, torch's, Python's and numpy's
    RNG states, and torch's thread count (reductions split by thread; ``threads``, the one asked for now, wins,
    with a note that the run may then differ from an uninterrupted one). The batches need no state: each is a
    pure function of ``(args.seed, step)``."""
    import numpy as np
    from transformers import AutoTokenizer

    state = torch.load(ckpt / "trainer_state.pt", weights_only=False, map_location="cpu")
    saved, now = _comparable_args(state["args"]), _comparable_args(asdict(args))
    if saved != now:
        raise KvbenchError(f"{ckpt} was written with different training arguments: {saved} != {now}")
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    model = load_trained(ckpt)
    optimizer = _optimizer(model, args)
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    if "numpy_rng" in state:  # checkpoints written before it was saved
        np.random.set_state(state["numpy_rng"])
    written = state.get("threads")
    if written is not None and threads is None and written <= local_cores():
        torch.set_num_threads(written)
    elif written is not None and (threads or torch.get_num_threads()) != written:
        from kvbench.logs import make_console

        make_console(stderr=True).print(
            f"note: {ckpt} was written with {written} threads, this run uses {threads or torch.get_num_threads()}: "
            "sums split by thread may round differently, so the result can differ from an uninterrupted run's",
            style="yellow", markup=False, soft_wrap=True,
        )  # fmt: skip
    return _Run(model, tokenizer, optimizer, state["step"], list(state["log"]))


def _from_init(init: Path, args: TrainArgs) -> _Run:
    """A later stage: the weights and tokenizer of the trained model ``init``, a fresh optimizer."""
    from transformers import AutoTokenizer

    if not (init / "config.json").exists():
        raise KvbenchError(f"--init {init}: no trained model there (expected config.json; a run's final/ dir)")
    tokenizer = AutoTokenizer.from_pretrained(init)
    model = load_trained(init)
    if arch_of(model.config) != args.arch:
        raise KvbenchError(
            f"--init {init} is a {model.config.model_type} model; give --arch {arch_of(model.config)} "
            "(a later stage keeps its architecture)"
        )
    return _Run(model, tokenizer, _optimizer(model, args), 0, [])


def _from_scratch(args: TrainArgs, tokenizer) -> _Run:
    """A first stage: ``tokenizer`` (default: one trained for ``args.vocab_size``) and a fresh model of
    ``args.arch`` with ``args.model_over``, initialised from torch's RNG."""
    tokenizer = tokenizer or train_tokenizer(vocab_size=args.vocab_size)
    config = tiny_trained_config(len(tokenizer), args.arch, **args.model_over)
    set_special_ids(config, tokenizer)
    model = build_model(config)
    return _Run(model, tokenizer, _optimizer(model, args), 0, [])


def _start(out_dir: Path, args: TrainArgs, options: RunOptions) -> _Run:
    """The run to continue: the latest checkpoint (with ``resume``), else ``args.init``, else from scratch.
    Seeds torch's RNG with ``args.seed`` first (a checkpoint then restores its own state)."""
    ckpt = _usable_checkpoint(out_dir) if options.resume else None
    torch.manual_seed(args.seed)
    if ckpt is not None:
        try:
            return _resume(ckpt, args, options.threads)
        except (KvbenchError, KeyboardInterrupt):
            raise
        except Exception as exc:  # a file the listing does not cover (or an older checkpoint without one)
            raise _damaged(ckpt, f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from exc
    if args.init is not None:
        return _from_init(Path(args.init), args)
    return _from_scratch(args, options.tokenizer)


# --------------------------------------------------------------------------------------------------
# The loop


def _train_step(run: _Run, args: TrainArgs, step: int) -> _Step:
    """One optimizer step on the batch of ``step`` (a pure function of ``(args.seed, step)``)."""
    length = curriculum_length(args.curriculum, step, args.steps)
    ids, mask, tasks = make_batch(
        run.tokenizer, seed=args.seed, step=step, batch_size=args.batch_size, length=length, mix=args.mix
    )
    lr_now = lr_at(step, args)
    for group in run.optimizer.param_groups:
        group["lr"] = lr_now
    tokens = ids.numel()  # the log's tok/s counts the batch as drawn, padding included
    ids, mask = trim_padding(ids, mask, run.tokenizer.pad_token_id)
    loss, row_ce = batch_loss(run.model, ids, mask, run.tokenizer.pad_token_id, args.lm_weight, args.autocast)
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
    run.optimizer.step()
    return _Step(loss.item(), lr_now, length, float(gnorm), task_losses(tasks, row_ce), tokens)


def _log_entry(step: int, result: _Step, tok_s: float, autocast: bool = False) -> dict:
    """The ``training_log.json`` entry of ``step`` (0-based; logged 1-based), keys in the file's order;
    ``"bf16": true`` last when the step ran under bf16 autocast."""
    return {
        "step": step + 1,
        "loss": round(result.loss, 5),
        "lr": result.lr,
        "len": result.length,
        "gnorm": round(result.gnorm, 4),
        "tok_s": round(tok_s),
        "tasks": result.tasks,
    } | ({"bf16": True} if autocast else {})


def _progress_bar(enabled: bool):
    """A rich progress bar (steps done of all, elapsed time, and a free ``info`` field); when stdout is not a
    terminal, a line every 30 s and at the end instead (:class:`kvbench.logs.LineProgress`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kvbench.logs import LineProgress, make_console

    console = make_console()
    if enabled and not console.is_terminal:
        return LineProgress(console, throttle_s=30.0)

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    )
    return Progress(*columns, console=console, disable=not enabled, transient=False)


def _run_steps(out_dir: Path, run: _Run, args: TrainArgs, end: int, progress: bool) -> None:
    """Steps ``run.start`` to ``end`` (exclusive), a checkpoint every ``args.save_every`` steps and at ``end``."""
    t0, tokens = time.perf_counter(), 0
    with _progress_bar(progress) as bar:
        job = bar.add_task("train", total=args.steps, completed=run.start, info="")
        for step in range(run.start, end):
            result = _train_step(run, args, step)
            tokens += result.tokens
            rate = tokens / (time.perf_counter() - t0)
            run.log.append(_log_entry(step, result, rate, args.autocast))
            ema = _ema_task_loss(run.log, "niah_single_1")
            info = f"len {result.length} loss {result.loss:.4f} niah_single_1 {ema:.3f} {rate:,.0f} tok/s"
            bar.update(job, advance=1, info=info)
            done = step + 1
            if done % args.save_every == 0 or done == end:
                _save_checkpoint(out_dir / f"checkpoint-{done}", run, done, args)


def train(out_dir: str | Path, args: TrainArgs, options: RunOptions | None = None) -> Path:
    """Train the tiny hybrid into ``out_dir`` and return ``out_dir/final`` (or the last checkpoint when
    ``options.stop_after`` ends the run early, which is how tests simulate an interruption).

    Checkpoints go to ``out_dir/checkpoint-<step>/`` every ``args.save_every`` steps (and at ``stop_after``).
    With ``options.resume`` the latest checkpoint is loaded and training continues bit-for-bit as if
    uninterrupted: step ``s``'s batch is derived from ``(seed, s)`` and the learning rate from ``s``; a run
    whose ``final/`` already holds these arguments returns it without training. ``options``: how to run it
    (default: ``RunOptions()``).

    ``args.autocast`` (bf16 on CPU, ``--autocast``) is off by default: it depends on the CPU. On an AMD EPYC
    without AVX-512 it made a step about 4x slower (246 vs 999 tok/s at 8x256, one thread); on an Intel Xeon with
    AVX-512-BF16 and AMX it made a 1 x 4,096 step 1.25x faster than without (docs/models.md, "Step time").
    The Gated DeltaNet layers run :mod:`kvbench_training.fast_gdn`'s chunk kernel (the same values as
    transformers' fallback to rounding, a faster backward; ``options.reference_gdn`` keeps the fallback).
    ``options.threads``: intra-op threads (on a shared 2-core machine, 1 thread is much faster than 2 when
    another process is busy: 2,787 vs 39 tok/s).

    ``args.init``: a trained model directory (a ``final/`` of an earlier run) whose weights and tokenizer
    this run starts from, with a fresh optimizer: a later training stage. Its ``training_args.json`` and
    ``training_log.json`` are carried into this run's ``final/`` so the model card describes every stage.
    ``args.arch``: ``qwen3_next`` (MoE, the shipped ``tiny-trained``) or ``qwen3_5`` (its dense
    ``qwen3_5_text`` twin, ``tiny-trained-dense``); with ``init`` it must be the init model's architecture."""
    options = options or RunOptions()
    if options.threads:
        torch.set_num_threads(options.threads)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_writes(out_dir)
    finished = _finished_run(out_dir, args) if options.resume else None
    if finished is not None:
        return finished
    run = _start(out_dir, args, options)
    run.model.train()
    end = args.steps if options.stop_after is None else min(args.steps, options.stop_after)
    replaced = {} if options.reference_gdn else fast_gdn.install()
    try:
        _run_steps(out_dir, run, args, end, options.progress)
    finally:
        fast_gdn.restore(replaced)
    if end < args.steps:
        return out_dir / f"checkpoint-{end}"
    return save_final(out_dir / "final", run.model, run.tokenizer, args, run.log)
