"""Does a model match keys? For RULER niah_multikey_2 items (seed 42), at the step that writes the answer's
first digit: the probability of the right digit, the digits the model spreads its mass over, and, per
attention layer and head, the attention mass on the queried needle's line against the most-attended other
needle line (rank 0: the queried line gets the most mass).

A model that copies *a* needle's value without matching keys puts about 1/k of its first-digit mass on each
of the k needles' first digits, and no head singles out the queried line. That is what the shipped
tiny-trained does (session 5), which is why its multi-key scores sit near chance.

Usage: .venv/bin/python scripts/diagnose_recall.py MODEL_DIR [--length 300] [--items 6] [--heads]
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvbench.prompt import encode, prompt_length, render
from kvbench.tasks.ruler import RulerBench
from kvbench_training import EVAL_SEED


def needle_spans(tokenizer, body: str) -> list[tuple[str, list[int]]]:
    """(line, body token positions overlapping it) for each line of ``body``."""
    enc = tokenizer(body, add_special_tokens=False, return_offsets_mapping=True)
    spans, start = [], 0
    for line in body.split("\n"):
        end = start + len(line)
        spans.append((line, [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < end and b > start]))
        start = end + 1
    return spans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--length", type=int, default=300, help="RULER --length of the items (300: 3 needles)")
    ap.add_argument("--items", type=int, default=6)
    ap.add_argument("--heads", action="store_true", help="print attention mass per layer and head")
    args = ap.parse_args()

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    attn_layers = [i for i, t in enumerate(model.config.layer_types) if t == "full_attention"]
    contexts = RulerBench().contexts(
        "niah_multikey_2", length=args.length, limit=args.items, seed=EVAL_SEED, prompt_length=prompt_length(tok)
    )
    probs, needles = [], []
    for ctx in contexts:
        r = render(tok, ctx)
        question = ctx.questions[0]
        answer = encode(tok, " " + question.references[0])
        first = next(i for i, t in enumerate(answer) if tok.decode([t]).strip())  # the first digit's index
        ids = r.context_ids + r.question_ids[0] + answer[:first]
        key = question.text.split(" for ", 1)[1].split(" mentioned", 1)[0]
        spans = needle_spans(tok, ctx.body)
        target = next(j for j, (line, _) in enumerate(spans) if f" {key} is" in line)
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_attentions=True)
        dist = out.logits[0, -1].float().softmax(-1)
        p = float(dist[answer[first]])
        probs.append(p)
        needles.append(len(spans))
        top = dist.topk(4)
        pairs = zip(top.values.tolist(), top.indices.tolist(), strict=True)
        shown = ", ".join(f"{tok.decode([i])!r} {v:.2f}" for v, i in pairs)
        print(f"item {ctx.item}: {len(spans)} needles, queried line {target}: p(right first digit) {p:.2f}  [{shown}]")
        if args.heads:
            for layer, att in zip(attn_layers, out.attentions, strict=True):
                last = att[0, :, -1]  # [heads, n]: attention of the answering position
                cells = []
                for h in range(last.shape[0]):
                    row = last[h]
                    mass = torch.tensor([float(row[[len(r.prefix_ids) + t for t in toks]].sum()) for _, toks in spans])
                    others = torch.cat([mass[:target], mass[target + 1 :]])
                    rank = int((mass > mass[target]).sum())
                    cells.append(f"h{h} {mass[target]:.2f}/{float(others.max()):.2f} r{rank}")
                print(f"    layer {layer:2d}: " + " | ".join(cells))
    chance = sum(1 / k for k in needles) / len(needles)
    print(f"mean p(right first digit) {sum(probs) / len(probs):.3f}; choosing a needle at random: about {chance:.3f}")


if __name__ == "__main__":
    main()
