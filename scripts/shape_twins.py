"""Shape twins measured directly (docs/cost.md, "At real widths"); `bash scripts/shape_twins.sh` runs both commands.

    python scripts/shape_twins.py check --model shape:Qwen/Qwen3.5-27B [--length 4096] [--device cpu] --out F.json
    python scripts/shape_twins.py table OUT      (OUT: the directory scripts/shape_twins.sh wrote)

``check``: one RULER niah_single_1 context prefilled once; the keep-all conformance (a child keeping every entry
answers token for token, logits equal, as its parent); every scored method's scoring seconds and its child at
p = 0.5 forked; the five children answering together (one batched loop, as `kvbench run` answers them); the peak
memory (the process's RSS, and the GPU's on CUDA). Writes F.json and exits 1 when the conformance fails.

``table``: from the `kvbench run` rows (prefill_s, score_s, fork_s, answer_s per row) in OUT/run-ENGINE-LENGTH and
the /usr/bin/time files, per engine, model and length: the context's tokens and prefill seconds, each method's scoring
seconds and scoring / prefill, the median fork and answer seconds, and the run's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

SCORED = ("snapkv", "keydiff", "triattention", "kvzip", "gatesight")


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(device: str, fn):
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return out, round(time.perf_counter() - t0, 4)


def check(model: str, length: int, device: str, dtype: str | None) -> dict:
    import torch

    from kvbench import selection
    from kvbench.methods import get_method
    from kvbench.models import load_model
    from kvbench.prompt import prompt_length, render
    from kvbench.run.loop import make_engine
    from kvbench.tasks.ruler import RulerBench

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    lm, load_s = _timed(device, lambda: load_model(model, device=device, dtype=dtype))
    ctx = next(iter(RulerBench().contexts("niah_single_1", length=length, limit=1, seed=42,
                                          prompt_length=prompt_length(lm.tokenizer))))  # fmt: skip
    r = render(lm.tokenizer, ctx)
    question, new = r.question_ids[0], ctx.questions[0].max_new_tokens
    engine = make_engine("torch", lm, length, device)
    methods = {name: get_method(name) for name in SCORED}
    rec: dict = {"model": model, "device": device, "dtype": str(next(lm.model.parameters()).dtype),
                 "context_tokens": len(r.context_ids), "seconds": {"load": round(load_s, 2)}}  # fmt: skip
    config = lm.model.config
    rec["widths"] = {k: getattr(config, k, None) for k in (
        "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "linear_num_key_heads",
        "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "num_experts",
        "num_experts_per_tok", "intermediate_size", "num_hidden_layers", "vocab_size")}  # fmt: skip
    rec["widths"]["partial_rotary_factor"] = (config.rope_parameters or {}).get("partial_rotary_factor")
    sec = rec["seconds"]
    try:
        window = max(m.query_window for m in methods.values())
        parent, sec["prefill"] = _timed(device, lambda: engine.prefill(r.context_ids, r.prot, query_window=window))
        ask = dict(max_new_tokens=new, context_sha256=parent.sha256, return_logits=True)
        want, sec["answer_parent"] = _timed(device, lambda: parent.answer(question, **ask))
        keep = selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads)
        child, sec["fork_keep_all"] = _timed(device, lambda: parent.fork(keep))
        got = child.answer(question, **ask)
        rec["keep_all_identical"] = got.token_ids == want.token_ids
        rec["keep_all_logits_equal"] = bool(torch.equal(got.step_logits, want.step_logits))
        rec["keep_all_real_fork"] = bool(child.stats.real_fork)
        child.release()
        kids = []
        for name, method in methods.items():
            scores, sec[f"score_{name}"] = _timed(device, lambda m=method: m.score(parent))
            kept = method.select(parent, scores, 0.5, method.default_allocation)
            kid, sec[f"fork_{name}"] = _timed(device, lambda k=kept: parent.fork(k))
            kids.append(kid)
        # the scored children answer together, as `kvbench run` answers them (one batched greedy loop)
        _, sec["answer_children_batched"] = _timed(
            device, lambda: parent.answer_children(kids, question, max_new_tokens=new, context_sha256=parent.sha256)
        )
        for kid in kids:
            kid.release()
        parent.release()
    finally:
        engine.close()
    rec["score_over_prefill"] = {n: round(sec[f"score_{n}"] / sec["prefill"], 4) for n in SCORED}
    rec["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if device.startswith("cuda"):
        rec["peak_gpu_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    rec["ok"] = bool(rec["keep_all_identical"] and rec["keep_all_logits_equal"] and rec["keep_all_real_fork"])
    return rec


def _peak_rss_mib(time_file: Path) -> float | None:
    for line in time_file.read_text().splitlines() if time_file.is_file() else []:
        if "Maximum resident set size" in line:
            return round(int(line.rsplit(":", 1)[1]) / 1024, 1)
    return None


def table(out: Path) -> list[dict]:
    """One line per (engine, model, length, method): the rows' seconds (see the module docstring), from the
    ``run-ENGINE-LENGTH`` directories scripts/shape_twins.sh writes."""
    lines = []
    for results in sorted(out.glob("run-*/results.jsonl")):
        engine, length = results.parent.name.split("-")[1:3]
        rows = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
        for model in sorted({r["model"] for r in rows}):
            mine = [r for r in rows if r["model"] == model]
            tag = model.replace("/", "-").replace(":", "-").replace("@", "-")
            prefill = statistics.median(r["prefill_s"] for r in mine)
            for method in sorted({r["method"] for r in mine}):
                rs = [r for r in mine if r["method"] == method]
                score = statistics.median(r["score_s"] for r in rs)
                lines.append({"engine": engine, "model": model, "length": int(length),
                              "n_context": int(statistics.median(r["n_context"] for r in rs)), "method": method,
                              "prefill_s": round(prefill, 2), "score_s": round(score, 3),
                              "score_over_prefill": round(score / prefill, 4),
                              "fork_s": round(statistics.median(r["fork_s"] for r in rs), 3),
                              "answer_s": round(statistics.median(r["answer_s"] for r in rs), 2),
                              "rows": len(rs), "peak_rss_mib": _peak_rss_mib(out / f"time-{engine}-{tag}-{length}.txt"),
                              })  # fmt: skip
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--model", required=True)
    c.add_argument("--length", type=int, default=4096)
    c.add_argument("--device", default="cpu")
    c.add_argument("--dtype", default=None)
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("table")
    t.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.cmd == "table":
        lines = table(args.out)
        head = ("engine", "model", "length", "n_context", "method", "prefill_s", "score_s", "score_over_prefill",
                "fork_s", "answer_s", "rows", "peak_rss_mib")  # fmt: skip
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for line in lines:
            print("| " + " | ".join(str(line[h]) for h in head) + " |")
        return 0
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    rec = check(args.model, args.length, args.device, args.dtype)
    from kvbench.atomic import write_atomic

    write_atomic(args.out, json.dumps(rec, indent=1))
    print(json.dumps({k: rec[k] for k in ("model", "context_tokens", "seconds", "peak_rss_mib", "ok")}))
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
