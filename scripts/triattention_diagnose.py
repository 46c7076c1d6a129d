"""Why TriAttention loses the needle on a shipped tiny model: head-level numbers for RULER niah_single_1 items
(seed 42, the run's own items, rendered and prefilled as ``kvbench run`` does), and the accuracy of a variant
that drops only the constant term.

Head mode (the default) prints, per item:

* which attention heads read the needle: at full cache, the attention mass that the position writing the
  answer's first token puts on the needle sentence, per attention layer and query head;
* for one layer and KV head (``--layer``, ``--kv-head``; default model layer 7, KV head 1) and each query head
  of its group: the cosine between the calibrated centre query over the un-rotated (pass-through) dims and the
  mean key over those dims (KeyDiff's anchor restricted to them); the Pearson correlation, over the evictable
  positions, of the constant term (the zero-frequency bands' trigonometric term, ``q̄·k`` over those dims) with
  KeyDiff's score;
* for that KV head, the rank (0 = kept first) of the worst-scored needle-value token among the evictable
  positions under each term of the score, z-scored per query head and maxed over the group as TriAttention
  selects, and under KeyDiff, beside the per-head budgets at p = 0.5 and 0.1 (the whole value is kept in that
  head when its rank is below the budget). Terms: ``default`` (the shipped method), ``trig`` (the trigonometric
  term over every band), ``const`` (its zero-frequency part), ``rotated`` (its rotated part), ``mlr`` (the
  magnitude term over every band), ``mlr_pass`` / ``mlr_rot`` (its pass-through / rotated part), ``no_const``
  (``default`` less ``const``), ``zero_freq_bands=false`` (``rotated`` + ``mlr_rot``).

Run mode (``--run OUT``) registers ``triattention-noconst`` (the score less the constant term: the rotated bands'
trigonometric term plus the magnitude term over every band) and runs ``kvbench run --model MODEL --method
triattention-noconst --bench ruler --task niah_single_1 --p 0.5,0.1 --limit ITEMS --threads 1 --out OUT``.

Usage: .venv/bin/python scripts/triattention_diagnose.py [--model tiny-trained] [--items 5] [--layer 7]
       [--kv-head 1] [--run OUT]
(docs/triattention.md gives its output for --items 10 on tiny-trained.)
"""

from __future__ import annotations

import argparse
import sys

import torch

from kvbench import budgets
from kvbench.engines.torch_engine import TorchEngine
from kvbench.methods import register_method
from kvbench.methods.keydiff import keydiff_scores
from kvbench.methods.triattention import TriAttention, TriAttentionStats, band_index, trig_scores, zscore
from kvbench.models import LoadedModel, cache_dir, load_model
from kvbench.prompt import Rendered, prompt_length, render
from kvbench.tasks import Context, get_bench

SEED, LENGTH, TASK, PS = 42, 1024, "niah_single_1", (0.5, 0.1)


class TriAttentionNoConst(TriAttention):
    """TriAttention less the constant term: the rotated bands' trigonometric term plus the magnitude (MLR) term
    over every band (the zero-frequency bands keep their magnitude term, lose their ``q̄·k`` term)."""

    name = "triattention-noconst"

    def head_scores(self, parent, stats: TriAttentionStats, f: int) -> torch.Tensor:
        return sum(terms(parent.keys(f), stats, f, parent.n)[t] for t in ("rotated", "mlr"))


def terms(keys: torch.Tensor, stats: TriAttentionStats, f: int, n: int) -> dict[str, torch.Tensor]:
    """The score's terms ``[H, n]`` for attention layer ``f`` (see the module doc), from :func:`trig_scores`."""
    q = (stats.q_mean_re[f], stats.q_mean_im[f], stats.q_abs_mean[f], stats.omega, stats.rotary_dim)

    def part(**kw) -> torch.Tensor:
        return trig_scores(keys, *q, round_start=n, **kw)

    out = {
        "default": part(),
        "trig": part(mlr=False),
        "rotated": part(mlr=False, zero_freq_bands=False),
        "mlr": part(trig=False),
        "mlr_rot": part(trig=False, zero_freq_bands=False),
    }
    out["const"] = out["trig"] - out["rotated"]
    out["mlr_pass"] = out["mlr"] - out["mlr_rot"]
    out["no_const"] = out["default"] - out["const"]
    out["zero_freq_bands=false"] = out["rotated"] + out["mlr_rot"]
    return out


def needle_positions(tokenizer, ctx: Context, rendered: Rendered) -> tuple[list[int], list[int]]:
    """Context positions of the needle sentence's tokens and of its value's tokens."""
    body, value = ctx.body, ctx.questions[0].references[0]
    at = body.index(value)
    start, end = body.rfind(".", 0, at) + 1, at + len(value)
    enc = tokenizer(body, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc["input_ids"]) != rendered.body_ids:
        raise SystemExit(f"item {ctx.item}: the body's tokens differ from the rendered ones (truncated?)")
    base = len(rendered.prefix_ids)

    def overlapping(a: int, b: int) -> list[int]:
        return [base + i for i, (s, e) in enumerate(enc["offset_mapping"]) if s < b and e > a]

    return overlapping(start, end), overlapping(at, end)


@torch.no_grad()
def needle_mass(eager: torch.nn.Module, rendered: Rendered, sentence: list[int]) -> torch.Tensor:
    """``[attention layers, H]``: attention mass on the needle sentence from the last prompt position (the one
    writing the answer's first token), full cache."""
    ids = rendered.context_ids + rendered.question_ids[0]
    out = eager(torch.tensor([ids]), output_attentions=True)
    return torch.stack([a[0, :, -1, sentence].sum(-1) for a in out.attentions if a is not None])


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def rank(scores: torch.Tensor, prot: int, targets: list[int]) -> int:
    """Rank (0 = first kept) of the worst-scored target among the positions ``prot..n-1``: every target is kept
    at a per-head budget above it."""
    body = scores[prot:].double()
    worst = min(float(body[t - prot]) for t in targets)
    return int((body > worst).sum())


def diagnose(lm: LoadedModel, eager: torch.nn.Module, ctx: Context, layer: int, kv_head: int) -> None:
    engine = TorchEngine(lm.model, lm.tokenizer, fingerprint=lm.fingerprint)
    rendered = render(lm.tokenizer, ctx, max_length=LENGTH)
    sentence, value = needle_positions(lm.tokenizer, ctx, rendered)
    attn_ids = list(engine.adapter.attn_layer_ids)
    f = attn_ids.index(layer)
    mass = needle_mass(eager, rendered, sentence)
    reads = ", ".join(f"L{attn_ids[i]} h{h} {float(mass[i, h]):.2f}" for i, h in _top(mass, 3))
    parent = engine.prefill(rendered.context_ids, rendered.prot, query_window=0)
    try:
        method = TriAttention()
        stats = method.load(parent)
        n, prot, R = parent.n, parent.prot, stats.rotary_dim
        keys = parent.keys(f).float()  # [H_kv, n, D]
        G = parent.n_heads // parent.n_kv_heads
        heads = list(range(kv_head * G, (kv_head + 1) * G))
        parts = terms(parent.keys(f), stats, f, n)
        anchor = keys[kv_head, :, R:].mean(0)  # the mean key over the pass-through dims
        keydiff = keydiff_scores(parent.keys(f))[kv_head]
        cells = []
        for h in heads:
            centre = _centre(stats, f, h)[R:]
            cos = float(centre @ anchor / (centre.norm() * anchor.norm()))
            corr = pearson(parts["const"][h, prot:], keydiff[prot:])
            cells.append(f"q{h}: cos(centre, mean key) {cos:+.2f}, corr(const, keydiff) {corr:+.2f}")
        budget = {p: budgets.per_head_budget(n, prot, p) for p in PS}
        ranks = {name: rank(zscore(s, prot)[heads].amax(0), prot, value) for name, s in parts.items()}
        ranks["keydiff"] = rank(keydiff, prot, value)
    finally:
        parent.release()
    print(f"item {ctx.item}: n {n}, prot {prot}, needle value at {value[0]}..{value[-1]}; reads the needle: {reads}")
    print(f"  layer {layer}, KV head {kv_head}: " + "; ".join(cells))
    shown = ", ".join(f"{k} {v}" for k, v in ranks.items())
    print(f"  needle value rank (budget {budget[PS[0]]} at p {PS[0]}, {budget[PS[1]]} at p {PS[1]}): {shown}")


def _top(mass: torch.Tensor, k: int) -> list[tuple[int, int]]:
    flat = mass.flatten().topk(k).indices.tolist()
    return [divmod(i, mass.shape[1]) for i in flat]


def _centre(stats: TriAttentionStats, f: int, h: int) -> torch.Tensor:
    """The calibrated centre query of layer ``f`` and head ``h`` as a ``[D]`` vector in the key layout."""
    re_idx, im_idx = band_index(stats.head_dim, stats.rotary_dim)
    centre = torch.zeros(stats.head_dim)
    centre[re_idx], centre[im_idx] = stats.q_mean_re[f, h], stats.q_mean_im[f, h]
    return centre


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-trained")
    ap.add_argument("--items", type=int, default=5)
    ap.add_argument("--layer", type=int, default=7, help="model layer index of an attention layer")
    ap.add_argument("--kv-head", type=int, default=1)
    ap.add_argument("--run", metavar="OUT", help="run triattention-noconst with kvbench run into OUT instead")
    args = ap.parse_args()
    if args.run:
        from kvbench import cli

        register_method(TriAttentionNoConst)
        sys.argv = ["kvbench", "run", "--model", args.model, "--method", TriAttentionNoConst.name, "--bench", "ruler",
                    "--task", TASK, "--p", ",".join(map(str, PS)), "--limit", str(args.items), "--threads", "1",
                    "--out", args.run]  # fmt: skip
        cli.main()
        return
    torch.set_num_threads(1)
    lm = load_model(args.model)
    eager = load_model(args.model).model
    eager.set_attn_implementation("eager")
    bench = get_bench("ruler")
    bench.cache_dir = cache_dir() / bench.name  # as kvbench run draws the items
    measure = prompt_length(lm.tokenizer)
    for ctx in bench.contexts(TASK, length=LENGTH, limit=args.items, seed=SEED, prompt_length=measure):
        diagnose(lm, eager, ctx, args.layer, args.kv_head)


if __name__ == "__main__":
    main()
