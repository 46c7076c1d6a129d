"""Which tokens of the asked pair does each method keep on SCBench kv? A kv answer needs the asked key and its
whole 36-character value (about 72 tokens of one pair among ~51 at 4,096 tokens); this prints, per method at a
kept fraction, the mean share of the asked key's and value's tokens kept (over attention layers, KV heads and
questions) and how often one (layer, KV head) keeps the whole pair.

Usage: .venv/bin/python scripts/diagnose_kv_kept.py [--model tiny-trained] [--p 0.5[,0.1...]] [--contexts 2]
    [--methods random:flat,snapkv:flat,keydiff:flat,kvzip:global,gatesight:gate,oracle:gate]
A method may carry options as ``kvbench run --set`` gives them: ``gatesight[calibration=generic]:gate``.

Generated kv contexts of the evaluation seed (42) at 4,096 tokens, float32, the torch engine, each method as
``kvbench run`` builds it (seed 42, its shipped artifacts).
"""

from __future__ import annotations

import argparse

import torch

from kvbench.methods import QuestionInput, get_method
from kvbench.models import load_model
from kvbench.prompt import prompt_length, render
from kvbench.run.loop import make_engine
from kvbench.tasks import BENCHES


def pair_spans(tok, ids: list[int], questions) -> list[tuple[list[int], list[int]]]:
    """Per question: the token positions of ``ids`` overlapping its asked key (quotes excluded) and its value.
    Raises ValueError when the decoded context does not re-encode to ``ids``."""
    text = tok.decode(ids)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    if enc["input_ids"] != ids:
        raise ValueError("the context does not re-encode to its own ids; pair positions cannot be mapped")
    offsets = enc["offset_mapping"]

    def positions(start: int, end: int) -> list[int]:
        return [i for i, (a, b) in enumerate(offsets) if a < end and b > start]

    spans = []
    for q in questions:
        value = q.references[0]
        v0 = text.index(f'"{value}"') + 1  # "KEY": "VALUE": the value's first character
        k1 = text.rindex('": "', 0, v0)  # end of the key
        k0 = text.rindex('"', 0, k1) + 1
        spans.append((positions(k0, k1), positions(v0, v0 + len(value))))
    return spans


def kept_shares(kept, spans) -> tuple[float, float, float]:
    """Mean share of key tokens kept, of value tokens kept, and of (layer, head) slots keeping the whole pair."""
    key = value = whole = 0.0
    slots = [set(h.tolist()) for layer in kept for h in layer]
    for ks, vs in spans:
        for s in slots:
            k = sum(i in s for i in ks) / len(ks)
            v = sum(i in s for i in vs) / len(vs)
            key, value, whole = key + k, value + v, whole + (k == 1 and v == 1)
    n = len(spans) * len(slots)
    return key / n, value / n, whole / n


def parse_method(entry: str) -> tuple[str, dict[str, str], str]:
    """``"NAME[OPT=V,...]:ALLOCATION"`` -> (name, options, allocation)."""
    spec, _, allocation = entry.rpartition(":")
    name, _, opts = spec.partition("[")
    options = dict(o.split("=", 1) for o in opts.rstrip("]").split(",") if o)
    return name, options, allocation


def diagnose_one(session, ctx, rendered, spans, entry: str, p: float) -> None:
    """Print the asked pairs' kept shares for one ``METHOD[OPTIONS]:ALLOCATION`` at kept fraction ``p``."""
    name, options, allocation = parse_method(entry)
    method = get_method(name, 42, options=options)
    if method.query_aware:  # the oracle: scored per question, each question's own child
        shares = []
        for q, ids, span in zip(ctx.questions, rendered.question_ids, spans, strict=True):
            scores = method.score_question(session, QuestionInput(tuple(ids), q.max_new_tokens))
            shares.append(kept_shares(method.select(session, scores, p, allocation), [span]))
        key, value, whole = (sum(s[i] for s in shares) / len(shares) for i in range(3))
    else:
        key, value, whole = kept_shares(method.select(session, method.score(session), p, allocation), spans)
    print(
        f"  {method.label:>12} [{allocation}]: key {key:.2f}, value {value:.2f} of their tokens kept; "
        f"whole pair in {whole:.2f} of (layer, KV head)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-trained")
    ap.add_argument("--p", default="0.5", help="kept fraction(s), comma-separated (one prefill serves them all)")
    ap.add_argument("--contexts", type=int, default=2)
    methods = "random:flat,snapkv:flat,keydiff:flat,triattention:flat,kvzip:global,gatesight:gate,oracle:gate"
    ap.add_argument("--methods", default=methods, help="METHOD:ALLOCATION,... (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, dtype="float32")
    engine = make_engine("torch", lm, 4096)
    tok = lm.tokenizer
    contexts = BENCHES.get("scbench")().contexts(
        "kv", length=4096, limit=args.contexts, seed=42, prompt_length=prompt_length(tok)
    )
    for ctx in contexts:
        rendered = render(tok, ctx, max_length=engine.max_context)
        spans = pair_spans(tok, rendered.context_ids, ctx.questions)
        session = engine.prefill(rendered.context_ids, rendered.prot, query_window=64)
        for p in (float(x) for x in args.p.split(",")):
            print(f"{args.model} kv #{ctx.item}: {len(rendered.context_ids)} tokens, {len(spans)} questions, p = {p}")
            for entry in args.methods.split(","):
                diagnose_one(session, ctx, rendered, spans, entry, p)
        session.release()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
