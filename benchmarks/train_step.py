"""Where a training step's time goes, and what the cheap changes buy, measured in one run.

For a 4,096-token step and a 512-token step of ``tiny-trained`` (training mode, rows from stage 10's mix:
``kvbench_training.make_batch``), times the forward, the backward and the optimizer (grad clip + AdamW), and
inside them the Gated DeltaNet chunk kernel (``torch_chunk_gated_delta_rule``, the torch fallback without
fla), the MoE block (router + experts + shared expert) and the router alone (forward: wall time of the calls
in the step; backward: the same calls replayed forward + backward on their recorded inputs, less their
forward). Then the same steps with each cheap change, side by side, tokens per second (padding included,
as the trainer's log counts them):

* ``baseline``: the step as trained until issue 44's trimming (torch threads as given by ``--threads``);
* ``trim``: the batch cut after its longest real row (right padding only; exact: padding has no loss weight
  and the model is causal, so the loss and gradients are unchanged, checked here): the trainer before issue 63
  (its loss: :func:`loss_before_63`);
* ``fast``: ``trim`` with the Gated DeltaNet chunk kernel of :mod:`kvbench_training.fast_gdn` and the loss over
  contiguous rows of logits: the trainer since issue 63 (``--reference-gdn`` keeps transformers' kernel);
* ``autocast``: ``fast`` with bf16 autocast (the loss in float32), for CPUs with fast bf16 matmuls;
* ``threads=N``: another intra-op thread count;
* ``compile``: ``torch.compile`` of the model (its first, compiling step reported apart).

The settings other than ``compile`` take their steps in turn (one step of each, then again), so a machine whose
load changes during the run slows them alike; each reports the median of its ``--repeat`` steps, and the
ratios to ``trim`` are printed with the load average before and after.

Packing several short rows into one is not tried: without fla, transformers' torch GDN kernel and causal
conv ignore ``cu_seqlens``, so the recurrent state would flow from one row into the next.

Usage: nice -n 19 .venv/bin/python benchmarks/train_step.py [--shapes 1x4096,8x512] [--repeat 3]
       [--settings baseline,trim,fast,autocast,threads,compile] [--threads 1] [--other-threads 2] [--no-compile]
       [--no-breakdown]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from kvbench_training import data as D
from kvbench_training import fast_gdn
from kvbench_training.loop import TrainArgs, _optimizer, batch_loss, loss_weights
from kvbench_training.model import load_trained

MODEL = "kvbench/builtin/tiny-trained"
MIX = D.parse_mix(
    "scbench_kv=0.3,scbench_kv8=0.2,lookup=0.1,niah_single_1=0.1,niah_multikey_2=0.1,vt=0.1,scbench_mf=0.1"
)


class Timers:
    """Wall seconds per label, and the recorded inputs of one call per label (for the backward replay)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, list] = defaultdict(list)
        self.on = False

    @contextmanager
    def part(self, label: str):
        t0 = time.perf_counter()
        yield
        if self.on:
            self.seconds[label] += time.perf_counter() - t0


TIMERS = Timers()


#: The unwrapped GDN chunk kernel (set by :func:`instrument`).
KERNEL: list = []


def instrument(model) -> None:
    """Wrap the GDN chunk kernel, each MoE block and each router with timers (forward) and record their inputs."""
    from transformers.models.qwen3_next import modeling_qwen3_next as mq

    kernel = KERNEL[0] if KERNEL else mq.torch_chunk_gated_delta_rule
    KERNEL[:] = [kernel]

    def timed_kernel(*args, **kw):
        if TIMERS.on:
            TIMERS.calls["gdn_kernel"].append((args, kw))
        with TIMERS.part("gdn_kernel"):
            return kernel(*args, **kw)

    mq.torch_chunk_gated_delta_rule = timed_kernel
    for module in model.modules():
        for cls, label in ((mq.Qwen3NextSparseMoeBlock, "moe_block"), (mq.Qwen3NextTopKRouter, "moe_router")):
            if isinstance(module, cls):
                forward = module.forward

                def timed(*args, _f=forward, _l=label, _m=module):
                    if TIMERS.on:
                        TIMERS.calls[_l].append((_m, args))
                    with TIMERS.part(_l):
                        return _f(*args)

                module.forward = timed


def _leaf(x):
    """A detached copy of a tensor argument that requires grad when floating point (others as they are)."""
    return x.detach().requires_grad_(x.is_floating_point()) if torch.is_tensor(x) else x


def replay_backward(label: str) -> float:
    """Seconds of the backward of every recorded ``label`` call: each call replayed forward on detached
    copies of its inputs, then only its backward timed."""
    total = 0.0
    for call in TIMERS.calls[label]:
        if label == "gdn_kernel":
            args, kw = call
            out = KERNEL[0](*[_leaf(a) for a in args], **{k: _leaf(v) for k, v in kw.items()})[0]
        else:
            module, args = call
            out = type(module).forward(module, *[_leaf(a) for a in args])
            out = out[1] if isinstance(out, tuple) else out  # the router: its routing weights
        t0 = time.perf_counter()
        out.float().sum().backward()
        total += time.perf_counter() - t0
    return total


def loss_before_63(model, ids, mask, pad_id, lm_weight, autocast):
    """The trainer's loss before issue 63 (same value as ``batch_loss``): cross-entropy over the logits viewed
    ``[B, vocab, T-1]``, whose softmax runs across strided memory."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    w = loss_weights(ids, mask, pad_id, lm_weight)[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (ce * w).sum() / w.sum().clamp_min(1e-6), None


def one_step(model, optimizer, ids, mask, pad_id, *, trim: bool, autocast=False, loss_fn=batch_loss) -> dict:
    """Forward, backward and optimizer of one step; returns seconds per part and the loss."""
    if trim:
        keep = int((ids != pad_id).any(0).nonzero().max()) + 1
        ids, mask = ids[:, :keep], mask[:, :keep]
    TIMERS.seconds.clear()
    TIMERS.calls.clear()
    TIMERS.on = True
    t0 = time.perf_counter()
    loss, _ = loss_fn(model, ids, mask, pad_id, 0.02, autocast)
    t1 = time.perf_counter()
    TIMERS.on = False
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    t2 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    t3 = time.perf_counter()
    out = {"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "loss": float(loss.detach())}
    out.update({f"{k} fwd": v for k, v in TIMERS.seconds.items()})
    return out


def breakdown(model, ids, mask, pad_id) -> dict[str, float]:
    """One baseline step with the components' backward replayed (slower: not used for tokens/s)."""
    optimizer = _optimizer(model, TrainArgs(steps=1, batch_size=1, lr=0.0, seed=0))
    parts = one_step(model, optimizer, ids, mask, pad_id, trim=False)
    for label in ("gdn_kernel", "moe_block", "moe_router"):
        parts[f"{label} bwd"] = replay_backward(label)
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x4096,8x512", help="the steps measured, ROWSxLENGTH,...")
    ap.add_argument("--settings", default="baseline,trim,fast,autocast,threads,compile", help="which to run")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the per-component breakdown")
    ap.add_argument("--repeat", type=int, default=3, help="timed steps per setting (the median is reported)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--other-threads", type=int, default=2, help="0: skip (slow on a busy machine: see docs)")
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL)
    pad = tok.pad_token_id
    model = load_trained(MODEL)
    model.train()
    instrument(model)
    shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    batches = {
        (rows, length): D.make_batch(tok, seed=99, step=0, batch_size=rows, length=length, mix=MIX)[:2]
        for rows, length in shapes
    }
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s); model {MODEL} (float32, training mode)")
    print("\n== where a baseline step's time goes (seconds; component backward by replay)")
    for (_, length), (ids, mask) in [] if args.no_breakdown else batches.items():
        b = breakdown(model, ids, mask, pad)
        total = b["forward"] + b["backward"] + b["optimizer"]
        print(
            f"{ids.shape[0]} x {length}: step {total:.2f} = forward {b['forward']:.2f} + backward {b['backward']:.2f}"
            f" + optimizer {b['optimizer']:.3f}"
        )
        for label in ("gdn_kernel", "moe_block", "moe_router"):
            f, w = b.get(f"{label} fwd", 0.0), b[f"{label} bwd"]
            print(
                f"    {label:<11} forward {f:6.2f} ({100 * f / b['forward']:4.1f} %)   backward {w:6.2f}"
                f" ({100 * w / b['backward']:4.1f} %)"
            )
    # the settings run on a fresh, uninstrumented copy (the timers' wrappers would break torch.compile's graph)
    from transformers.models.qwen3_next import modeling_qwen3_next as mq

    mq.torch_chunk_gated_delta_rule = KERNEL[0]
    model = load_trained(MODEL)
    model.train()
    chosen = args.settings.split(",")
    settings = [s for s in ("baseline", "trim", "fast", "autocast") if s in chosen]
    settings += [f"threads={args.other_threads}"] if "threads" in chosen and args.other_threads else []
    print(f"\n== tokens / second (padding included, median of {args.repeat} steps), side by side", flush=True)
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    names = "".join(f"{f'{rows} x {n}':>14}" for rows, n in batches)
    rates: dict[str, list[float]] = {s: [] for s in settings}
    losses: dict[str, list[float]] = {s: [] for s in settings}
    for ids, mask in batches.values():
        optimizer = _optimizer(model, TrainArgs(steps=1, batch_size=1, lr=0.0, seed=0))  # lr 0: weights kept
        seconds: dict[str, list[float]] = {s: [] for s in settings}
        for _ in range(args.repeat):
            for setting in settings:  # in turn, so load changes slow every setting alike
                parts = _setting_step(setting, model, optimizer, ids, mask, pad, args)
                seconds[setting].append(parts["forward"] + parts["backward"] + parts["optimizer"])
                if len(seconds[setting]) == 1:
                    losses[setting].append(parts["loss"])
        for setting in settings:
            median = statistics.median(seconds[setting])
            rates[setting].append(ids.numel() / median)
            steps = ", ".join(f"{x:.2f}" for x in seconds[setting])
            print(f"  ({setting}, {ids.shape[0]} x {ids.shape[1]}: steps {steps} s, median {median:.2f})", flush=True)
    print(f"{'setting':<12}{names}   loss per shape   (x trim)", flush=True)
    for setting in settings:
        cells = "".join(f"{r:>14,.0f}" for r in rates[setting])
        ratio = ""
        if "trim" in rates:
            ratio = "   " + ", ".join(f"{r / t:.2f}x" for r, t in zip(rates[setting], rates["trim"], strict=True))
        print(f"{setting:<12}{cells}   " + ", ".join(f"{x:.5f}" for x in losses[setting]) + ratio, flush=True)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    if "compile" in chosen and not args.no_compile:
        _compiled(model, batches, pad, args)
    torch.set_num_threads(args.threads)


def _setting_step(setting, model, optimizer, ids, mask, pad, args) -> dict[str, float]:
    """One timed step of ``setting`` (not ``compile``): its thread count, trimming, GDN kernel and autocast."""
    torch.set_num_threads(args.other_threads if setting.startswith("threads") else args.threads)
    replaced = fast_gdn.install() if setting in ("fast", "autocast") else None
    try:
        loss_fn = batch_loss if setting in ("fast", "autocast") else loss_before_63
        trim, autocast = setting != "baseline", setting == "autocast"
        return one_step(model, optimizer, ids, mask, pad, trim=trim, autocast=autocast, loss_fn=loss_fn)
    finally:
        if replaced is not None:
            fast_gdn.restore(replaced)
        torch.set_num_threads(args.threads)


def _compiled(model, batches, pad, args) -> None:
    """``torch.compile`` of the model (the reference kernel, untrimmed batches: one shape each), its compiling
    step reported apart, then tokens / s as the median of ``--repeat`` steps."""
    step_model = torch.compile(model, dynamic=False)
    rates, losses = [], []
    for ids, mask in batches.values():
        optimizer = _optimizer(model, TrainArgs(steps=1, batch_size=1, lr=0.0, seed=0))
        t0 = time.perf_counter()
        try:  # one untimed step per shape compiles forward and backward
            one_step(step_model, optimizer, ids, mask, pad, trim=False)
        except Exception as exc:  # noqa: BLE001 - report any compile failure and go on
            print(f"compile: failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
            return
        print(f"(compile: the compiling {ids.shape[0]} x {ids.shape[1]} step took {time.perf_counter() - t0:.1f} s)")
        seconds = []
        for _ in range(args.repeat):
            parts = one_step(step_model, optimizer, ids, mask, pad, trim=False)
            seconds.append(parts["forward"] + parts["backward"] + parts["optimizer"])
        rates.append(ids.numel() / statistics.median(seconds))
        losses.append(parts["loss"])
    cells = "".join(f"{r:>14,.0f}" for r in rates)
    print(f"{'compile':<12}{cells}   " + ", ".join(f"{x:.5f}" for x in losses), flush=True)


if __name__ == "__main__":
    main()
