"""Does a model match SCBench kv keys? On generated SCBench kv rows (evaluation seed 42 by default, the
generator's own rows and questions, at a given number of key-value pairs), at the step that writes the
value's first token:

* the probability of the right value's first ``--first`` tokens against every other pair's value (teacher
  forced from the question: ``P(v[:k] | context, question)``), the right one's rank among the row's values
  (0 = most probable; top-1 is rank 0) and the mean mass on the right value against all others together;
* per attention layer and head, the attention mass of that step on the queried key's tokens in the context
  against the most-attended other key (rank 0: the queried key gets the most mass).

A model that copies *a* UUID without matching the key spreads its mass over the pairs' values (top-1 about
1 / pairs) and no head singles out the queried key. Prints a table; ``--json`` writes every number.
``--require-top1 X`` exits 3 when the top-1 rate at any ``--pairs`` is below X (the gate of
``scripts/train_tiny.sh``'s stages 10b-10d).

Usage: .venv/bin/python scripts/probe_kv.py MODEL_DIR [--pairs 8,16,51] [--rows 4] [--seed 42] [--first 4]
       [--json OUT.json] [--require-top1 0.8] [--threads N] [--key-chars N]
``--key-chars N`` cuts every key to its first N hex characters (the ``scbench_kv8_short`` curriculum rows'
keys, ``kvbench_training.shorten_kv_keys``), to probe the short-key stage on its own kind of row.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvbench.prompt import encode, render
from kvbench.tasks.scbench import build_context
from kvbench.tasks.scbench_generate import kv_row
from kvbench_training import EVAL_SEED
from kvbench_training.data import shorten_kv_keys


def key_spans(tok, context_ids: list[int], keys: list[str]) -> list[list[int]]:
    """Token positions of ``context_ids`` overlapping each key's first occurrence (characters) in its text.
    Raises ValueError when re-encoding the decoded text does not give ``context_ids`` back."""
    text = tok.decode(context_ids)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    if enc["input_ids"] != context_ids:
        raise ValueError("the context does not re-encode to its own ids; key positions cannot be mapped")
    spans = []
    for key in keys:
        start = text.index(f'"{key}"') + 1
        end = start + len(key)
        spans.append([i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < end and b > start])
    return spans


def _forward(model, ids: list[int], cache, attentions: bool = False):
    return model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, output_attentions=attentions)


def probe_question(model, tok, ctx_out, question_ids, values, target, spans, first, attn_layers):
    """One question after the context (``ctx_out``: the context's forward, with its cache): the
    log-probability of every value's first ``first`` tokens (``values[target]`` is the right one), per
    attention layer the ``[heads, pairs]`` attention mass of the answering step on each key's tokens
    (``spans``), and the right value's first-token probability."""
    q_out = _forward(model, question_ids, copy.deepcopy(ctx_out.cache), attentions=True)
    logp0 = q_out.logits[0, -1].float().log_softmax(-1)
    scores = []
    for value in values:
        v = encode(tok, value)[:first]
        total = float(logp0[v[0]])
        if len(v) > 1:
            out = _forward(model, v[:-1], copy.deepcopy(q_out.cache))
            logp = out.logits[0].float().log_softmax(-1)
            total += float(sum(logp[i, t] for i, t in enumerate(v[1:])))
        scores.append(total)
    heads = {}
    for layer, att in zip(attn_layers, q_out.attentions, strict=True):
        last = att[0, :, -1].float()  # [heads, keys]: the answering position's attention
        heads[layer] = torch.stack([last[:, s].sum(-1) for s in spans], dim=1)  # [heads, pairs]
    p1 = float(logp0.exp()[encode(tok, values[target])[0]])
    return scores, heads, p1


def probe(
    model,
    tok,
    pairs: int,
    rows: int,
    seed: int,
    first: int,
    key_chars: int | None = None,
    echo: bool = False,
    say: bool = False,
) -> dict:
    """Every question of ``rows`` generated kv rows of ``pairs`` pairs (keys cut to ``key_chars`` characters
    when given): per-question numbers and summaries. ``echo``: the answer turn starts with the asked pair's own
    text up to its value (``"KEY": "``, as the ``*_echo`` training rows give it), so the value is scored as a
    plain copy of what follows the key in the context (induction) rather than as the answer to the question.
    ``say``: each candidate is a pair's whole quoted text ``"KEY": "VALUE`` (the ``*_say`` rows' answer), its
    first ``first`` value tokens after the quoted key: the model must pick the asked key and then its value."""
    attn_layers = [i for i, t in enumerate(model.config.layer_types) if t == "full_attention"]
    questions = []
    head_sum: dict[int, dict[str, torch.Tensor]] = {}
    for index in range(rows):
        row = kv_row(seed, index, pairs)
        if key_chars is not None:
            row = shorten_kv_keys(row, key_chars)
        items = list(json.loads(row["context"].removeprefix("JSON data:\n")).items())
        keys, values = [k for k, _ in items], [v for _, v in items]
        ctx = build_context("kv", index, row, {}, source="generated")
        r = render(tok, ctx)
        spans = key_spans(tok, r.context_ids, keys)
        with torch.no_grad():
            ctx_out = _forward(model, r.context_ids, None)
            for question, question_ids in zip(ctx.questions, r.question_ids, strict=True):
                target = values.index(question.references[0])
                if echo:
                    question_ids = list(question_ids) + encode(tok, f'"{keys[target]}": "')
                candidates, n_first = values, first
                if say:
                    candidates = [f'"{k}": "{v}' for k, v in zip(keys, values, strict=True)]
                    n_first = len(encode(tok, f'"{keys[target]}": "')) + first
                scores, heads, p1 = probe_question(
                    model, tok, ctx_out, question_ids, candidates, target, spans, n_first, attn_layers
                )
                probs = torch.tensor(scores).exp()
                rank = int((probs > probs[target]).sum())
                others = float(probs.sum() - probs[target])
                questions.append(
                    {
                        "row": index,
                        "pair": target,
                        "rank": rank,
                        "p_right": float(probs[target]),
                        "p_others": others,
                        "p_first_token": p1,
                    }
                )
                for layer, mass in heads.items():
                    right = mass[:, target]
                    other = torch.cat([mass[:, :target], mass[:, target + 1 :]], dim=1).max(1).values
                    s = head_sum.setdefault(layer, {"right": 0, "other": 0, "top": 0})
                    s["right"] = s["right"] + right
                    s["other"] = s["other"] + other
                    s["top"] = s["top"] + (right >= other).float()
    n = len(questions)
    heads_out = {
        str(layer): [
            {
                "head": h,
                "mass_queried_key": round(float(s["right"][h]) / n, 4),
                "mass_top_other_key": round(float(s["other"][h]) / n, 4),
                "queried_top": round(float(s["top"][h]) / n, 3),
            }
            for h in range(len(s["right"]))
        ]
        for layer, s in head_sum.items()
    }
    return {
        "pairs": pairs,
        "questions": n,
        "top1": sum(q["rank"] == 0 for q in questions) / n,
        "mean_rank": sum(q["rank"] for q in questions) / n,
        "p_right": sum(q["p_right"] for q in questions) / n,
        "p_others": sum(q["p_others"] for q in questions) / n,
        "p_first_token": sum(q["p_first_token"] for q in questions) / n,
        "chance_top1": 1 / pairs,
        "heads": heads_out,
        "per_question": questions,
    }


def print_table(model_dir: str, results: list[dict], first: int) -> None:
    print(f"{model_dir}: SCBench kv, p of the value's first {first} tokens (teacher-forced)")
    print(
        f"{'pairs':>5} {'questions':>9} {'top-1':>6} {'chance':>6} {'mean rank':>9} {'p right':>8} "
        f"{'p others':>8} {'p 1st tok':>9}"
    )
    for r in results:
        print(
            f"{r['pairs']:>5} {r['questions']:>9} {r['top1']:>6.2f} {r['chance_top1']:>6.2f} {r['mean_rank']:>9.1f} "
            f"{r['p_right']:>8.3f} {r['p_others']:>8.3f} {r['p_first_token']:>9.3f}"
        )
    for r in results:
        print(f"  attention at {r['pairs']} pairs: head mass on queried key / top other key (queried-top rate)")
        for layer, heads in r["heads"].items():
            cells = " | ".join(
                f"h{h['head']} {h['mass_queried_key']:.2f}/{h['mass_top_other_key']:.2f} ({h['queried_top']:.2f})"
                for h in heads
            )
            print(f"    layer {int(layer):2d}: {cells}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--pairs", default="8,16,51", help="comma-separated pair counts (51: a 4,096-token context)")
    ap.add_argument("--rows", type=int, default=4, help="generated rows per pair count (5 questions each)")
    ap.add_argument("--seed", type=int, default=EVAL_SEED, help="generator seed (default: evaluation's 42)")
    ap.add_argument("--first", type=int, default=4, help="value tokens scored (a UUID: mostly 1 hex char each)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--require-top1", type=float, help="exit 3 when the top-1 rate is below this")
    ap.add_argument("--threads", type=int, help="torch intra-op threads")
    ap.add_argument("--key-chars", type=int, help="cut every key to its first N characters (short-key rows)")
    ap.add_argument("--echo", action="store_true",
                    help='the answer starts with the asked pair\'s "KEY": " (*_echo rows): copying, not matching')
    ap.add_argument("--say", action="store_true",
                    help='candidates are whole quoted pairs "KEY": "VALUE (the *_say rows\' answer)')
    args = ap.parse_args(argv)
    try:
        pairs = [int(p) for p in args.pairs.split(",")]
    except ValueError:
        ap.error(f"--pairs {args.pairs!r}: expected comma-separated integers, e.g. 8,16,51")
    if args.rows < 1 or args.first < 1 or min(pairs) < 5:
        ap.error("--rows and --first must be at least 1 and every --pairs at least 5 (five questions a row)")
    if args.key_chars is not None and args.key_chars < 1:
        ap.error(f"--key-chars {args.key_chars}: give at least 1 (a key's first N characters)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if not (Path(args.model) / "config.json").is_file():
        ap.error(f"{args.model}: no model there (expected config.json; a run's final/ or checkpoint-N/ dir)")
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    if args.echo and args.say:
        ap.error("--echo and --say: give one (--echo feeds the quoted key, --say scores it)")
    results = [
        probe(model, tok, n, args.rows, args.seed, args.first, args.key_chars, args.echo, args.say) for n in pairs
    ]
    print_table(args.model, results, args.first)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"model": args.model, "seed": args.seed, "first": args.first, "rows": args.rows,
                   "echo": args.echo, "say": args.say, "results": results}  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=1))
    if args.require_top1 is not None and any(r["top1"] < args.require_top1 for r in results):
        worst = min(results, key=lambda r: r["top1"])
        print(
            f"key matching not learned: top-1 {worst['top1']:.2f} at {worst['pairs']} pairs < "
            f"--require-top1 {args.require_top1}",
            file=sys.stderr,
        )
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
