"""Protocol cost on the default model: prefill vs fork vs answer, measured side by side in one run.

For each context length: prefill seconds, fork seconds (all nine p, flat allocation, random scores),
answer seconds per question (a 20-token question + 32 greedy tokens from a p = 0.5 child), and the
ratios fork/prefill and harness overhead / total, where the harness overhead is scoring-independent
protocol work (snapshot restore + fork + cache assembly), i.e. total minus the model forwards. Beside
them, on the same parents: KVzip's scoring seconds / prefill, and for its ``global`` allocation at
p = 0.5 and 0.1 the child's stored bytes / the kept entries' bytes (and what a layout padded to each
layer's widest head would store). Medians over ``--repeats`` after one warm-up. Usage::

    python benchmarks/protocol_cost.py --lengths 4096,16384 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvbench import budgets, selection
from kvbench.cost import measure_storage
from kvbench.engines.torch_engine import TorchEngine
from kvbench.methods import get_method
from kvbench.models import DEFAULT_MODEL, load_model


def _forward_seconds(engine: TorchEngine, ids: list[int]) -> float:
    """Seconds of one plain stock-cache forward over ``ids`` (the model work a prefill cannot avoid)."""
    start = time.perf_counter()
    with torch.no_grad():
        engine.model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
    return time.perf_counter() - start


def measure(engine: TorchEngine, n: int, repeats: int, new_tokens: int) -> dict:
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(0, 256, (n,), generator=g).tolist()
    question = torch.randint(0, 256, (20,), generator=g).tolist()
    rows = {"prefill": [], "plain_forward": [], "fork_all_p": [], "answer": [], "kvzip": []}
    kvzip = get_method("kvzip")
    for rep in range(repeats + 1):
        parent = engine.prefill(ids, prot=64)
        start = time.perf_counter()
        kvzip_scores = kvzip.score(parent)
        kvzip_s = time.perf_counter() - start
        storage = measure_storage(parent, kvzip, kvzip_scores)
        plain = _forward_seconds(engine, ids)
        scores = [torch.rand(parent.n_kv_heads, n, generator=g) for _ in range(parent.n_attn_layers)]
        fork_s = 0.0
        for p in budgets.ALL_P:
            k = budgets.per_head_budget(n, parent.prot, p)
            kept = selection.select_per_head(scores, [k] * parent.n_attn_layers, parent.prot)
            child = parent.fork(kept)
            fork_s += child.fork_seconds
            if p == 0.5:
                answer = child.answer(question, max_new_tokens=new_tokens, context_sha256=parent.sha256, stop_ids=())
            child.release()
        parent.release()
        if rep == 0:
            continue  # warm-up
        rows["prefill"].append(parent.prefill_seconds)
        rows["plain_forward"].append(plain)
        rows["fork_all_p"].append(fork_s)
        rows["answer"].append(answer.seconds)
        rows["kvzip"].append(kvzip_s)
    return {**{k: statistics.median(v) for k, v in rows.items()}, "storage": storage}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model)
    engine = TorchEngine(lm.model, lm.tokenizer)
    print(
        f"model {lm.name} ({sum(p.numel() for p in lm.model.parameters()) / 1e6:.2f}M params), "
        f"{args.threads} threads, median of {args.repeats} after a warm-up"
    )
    print(
        f"{'n':>6} {'prefill s':>10} {'plain fwd s':>11} {'fork 9p s':>10} {'answer s':>9} {'fork/prefill':>12} "
        f"{'capture/prefill':>15} {'harness/total':>13} {'kvzip/prefill':>13}  global stored/needed (padded/needed)"
    )
    for n in (int(x) for x in args.lengths.split(",")):
        m = measure(engine, n, args.repeats, args.new_tokens)
        ratio = m["fork_all_p"] / m["prefill"]
        capture = m["prefill"] - m["plain_forward"]
        total = m["prefill"] + m["fork_all_p"] + 9 * m["answer"]
        harness = max(capture, 0.0) + m["fork_all_p"]
        print(
            f"{n:>6} {m['prefill']:>10.3f} {m['plain_forward']:>11.3f} {m['fork_all_p']:>10.4f} {m['answer']:>9.3f} "
            f"{ratio:>12.4f} {capture / m['prefill']:>15.1%} {harness / total:>13.2%} "
            f"{m['kvzip'] / m['prefill']:>13.3f}  "
            + "  ".join(f"p={x.p}: {x.stored_over_needed:.4f} ({x.padded_over_needed:.4f})" for x in m["storage"])
        )
    print("fork/prefill: nine forks (p = 0.9 .. 0.1) against one prefill. capture/prefill: (prefill - plain forward)")
    print("/ prefill, the cost of recording signals, gates and queries. harness/total: (capture + forks) over one")
    print("context's protocol (prefill + nine forks + one answer per fork). kvzip/prefill: KVzip's scoring pass")
    print("over the prefill. global stored/needed: a KVzip global child's stored bytes over its kept entries' bytes")
    print("(padded/needed: the same for a layout padded to each layer's widest head), last repeat.")


if __name__ == "__main__":
    main()
