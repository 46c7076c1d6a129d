"""The GPU check: kvbench's engines on a CUDA device, one JSON verdict (``bash scripts/gpu_check.sh`` runs it).

Three parts, each recorded on its own so that one failing part does not hide the others:

* ``torch_engine``, per shipped family (``tiny-trained``: Qwen3-Next MoE, ``tiny-trained-dense``: Qwen3.5), in
  float32 on the GPU and, as the reference, on this machine's CPU: RULER-4096 contexts (niah_single_1, no data
  file needed) prefilled on both devices; the parent's greedy answer on the GPU against the CPU's (token for token,
  and the largest step-logit difference); a keep-all child against its parent on the GPU (token for token: the
  protocol's identity); every method's kept set at p = 0.1 on the GPU against the CPU's (overlap); a flat child
  (SnapKV) and a ragged one (KVzip's ``global`` allocation, different counts per KV head) answering alone and
  batched on the GPU (token for token); prefill / score / fork / answer seconds and the GPU's peak memory.
* ``kvbench_run``: ``kvbench run --device cuda`` end to end on both models (every built-in method, two kept
  fractions, RULER and SCBench's generated kv task) and the same grid with ``--device cpu``: rows written, and the
  share of rows whose prediction is identical on both devices.
* ``vllm``: whether a CUDA vLLM at the pinned version is importable. The vllm engine's GPU path is checked only
  where it is (see docs/engines.md); otherwise the part says why it did not run.

``--device cpu`` runs the same code with the CPU on both sides (a dry run of this script on machines without a
GPU; its numbers say nothing about GPUs).

    python scripts/gpu_check.py --out DIR [--device cuda] [--items 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

FAMILIES = ("tiny-trained", "tiny-trained-dense")
METHODS = ("full", "random", "snapkv", "keydiff", "triattention", "kvzip", "gatesight", "oracle")
SCORED = ("snapkv", "keydiff", "triattention", "kvzip", "gatesight")
LENGTH = 4096
PINNED_VLLM = "0.32.0"
RUN_TIMEOUT_S = 150  # each `kvbench run` of the check (the script's budget is 8 minutes)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextlib.contextmanager
def _timed(seconds: dict, key: str, device: str):
    _sync(device)
    t0 = time.perf_counter()
    yield
    _sync(device)
    seconds.setdefault(key, []).append(round(time.perf_counter() - t0, 4))


def _items(lm, limit: int) -> list[dict]:
    from kvbench.prompt import prompt_length, render
    from kvbench.tasks.ruler import RulerBench

    out = []
    for ctx in RulerBench().contexts(
        "niah_single_1", length=LENGTH, limit=limit, seed=42, prompt_length=prompt_length(lm.tokenizer)
    ):
        r = render(lm.tokenizer, ctx)
        out.append({"item": ctx.item, "context_ids": r.context_ids, "prot": r.prot,
                    "question_ids": r.question_ids[0], "new": ctx.questions[0].max_new_tokens})  # fmt: skip
    return out


def _keep_all(parent):
    import torch

    return [[torch.arange(parent.n) for _ in range(parent.n_kv_heads)] for _ in range(parent.n_attn_layers)]


def _overlap(a, b) -> float:
    shares = []
    for la, lb in zip(a, b, strict=True):
        for ha, hb in zip(la, lb, strict=True):
            sa, sb = set(ha.tolist()), set(hb.tolist())
            if sa:
                shares.append(len(sa & sb) / len(sa))
    return sum(shares) / len(shares) if shares else 1.0


def _one_item(engine, methods, it: dict, device: str, seconds: dict) -> dict:
    """Everything measured on one context on one engine: answers (ids, logits), kept sets, identity checks."""
    window = max(m.query_window for m in methods.values())
    with _timed(seconds, "prefill", device):
        parent = engine.prefill(it["context_ids"], it["prot"], query_window=window)
    rec: dict = {"kept": {}}
    try:
        sha = parent.sha256
        with _timed(seconds, "answer_parent", device):
            a = parent.answer(it["question_ids"], max_new_tokens=it["new"], context_sha256=sha, return_logits=True)
        rec["parent_ids"], rec["parent_logits"] = a.token_ids, a.step_logits.float().cpu()
        with _timed(seconds, "fork_keep_all", device):
            child = parent.fork(_keep_all(parent))
        c = child.answer(it["question_ids"], max_new_tokens=it["new"], context_sha256=sha, return_logits=True)
        rec["keep_all_identical"] = c.token_ids == a.token_ids
        rec["keep_all_logit_diff"] = float((c.step_logits.float().cpu() - rec["parent_logits"]).abs().max())
        rec["keep_all_real_fork"] = bool(child.stats.real_fork)
        child.release()
        for name in SCORED:
            method = methods[name]
            with _timed(seconds, f"score_{name}", device):
                scores = method.score(parent)
            kept = method.select(parent, scores, 0.1, method.default_allocation)
            rec["kept"][name] = [[idx.cpu() for idx in layer] for layer in kept]
        # a flat child (equal counts per head) and a ragged one (KVzip's global allocation), alone then batched
        alone, kids = [], []
        for name in ("snapkv", "kvzip"):
            with _timed(seconds, "fork", device):
                kid = parent.fork(rec["kept"][name])
            with _timed(seconds, "answer_child", device):
                alone.append(kid.answer(it["question_ids"], max_new_tokens=it["new"], context_sha256=sha).token_ids)
            kids.append(kid)
        with _timed(seconds, "answer_batched_2", device):
            batched = parent.answer_children(kids, it["question_ids"], max_new_tokens=it["new"], context_sha256=sha)
        rec["batched_identical"] = [b.token_ids == x for b, x in zip(batched, alone, strict=True)]
        rec["ragged_counts_differ"] = any(len({len(i) for i in layer}) > 1 for layer in rec["kept"]["kvzip"])
        for kid in kids:
            kid.release()
    finally:
        parent.release()
    return rec


def check_torch_engine(model: str, device: str, limit: int) -> dict:
    import torch

    from kvbench.methods import get_method
    from kvbench.models import load_model
    from kvbench.run.loop import make_engine

    result: dict = {"model": model, "device": device, "dtype": "float32", "items": limit}
    per_device = {}
    for dev in dict.fromkeys((device, "cpu")):
        if dev.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        lm = load_model(model, device=dev, dtype="float32")
        load_s = time.perf_counter() - t0
        items = _items(lm, limit)
        result["context_tokens"] = [len(it["context_ids"]) for it in items]
        engine = make_engine("torch", lm, LENGTH, dev)
        methods = {name: get_method(name) for name in SCORED}
        seconds: dict = {"load_model": [round(load_s, 3)]}
        try:
            recs = [_one_item(engine, methods, it, dev, seconds) for it in items]
        finally:
            engine.close()
        per_device[dev] = (recs, seconds)
        if dev.startswith("cuda"):
            result["peak_gpu_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        del lm, engine
    recs, seconds = per_device[device]
    cpu_recs, cpu_seconds = per_device["cpu"]
    result["keep_all_identical"] = all(r["keep_all_identical"] for r in recs)
    result["keep_all_logit_diff_max"] = max(r["keep_all_logit_diff"] for r in recs)
    result["keep_all_real_fork"] = all(r["keep_all_real_fork"] for r in recs)
    result["batched_identical"] = all(all(r["batched_identical"]) for r in recs)
    result["ragged_path_exercised"] = all(r["ragged_counts_differ"] for r in recs)
    pairs = list(zip(recs, cpu_recs, strict=True))
    result["parent_tokens_equal_cpu"] = sum(r["parent_ids"] == c["parent_ids"] for r, c in pairs)
    result["parent_logit_diff_vs_cpu_max"] = max(
        float(
            (r["parent_logits"][: len(c["parent_logits"])] - c["parent_logits"][: len(r["parent_logits"])]).abs().max()
        )  # fmt: skip
        for r, c in zip(recs, cpu_recs, strict=True)
    )
    result["kept_overlap_vs_cpu"] = {
        name: round(min(_overlap(r["kept"][name], c["kept"][name]) for r, c in zip(recs, cpu_recs, strict=False)), 4)
        for name in SCORED
    }
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    result["seconds_median"] = {device: {k: med(v) for k, v in seconds.items()},
                                "cpu": {k: med(v) for k, v in cpu_seconds.items()}}  # fmt: skip
    result["ok"] = bool(
        result["keep_all_identical"]
        and result["batched_identical"]
        and result["keep_all_real_fork"]
        and result["parent_tokens_equal_cpu"] == limit
        and min(result["kept_overlap_vs_cpu"].values()) >= 0.95
    )
    return result


def _kvbench(args: list[str], log: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        try:
            rc = subprocess.call([sys.executable, "-P", "-c", "from kvbench.cli import main; main()", *args],
                                 stdout=fh, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S)  # fmt: skip
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, round(time.perf_counter() - t0, 1)


def check_kvbench_run(device: str, out: Path) -> dict:
    """``kvbench run`` end to end on both models, on ``device`` and on the CPU; rows compared by identity."""
    import msgspec

    grid = ["--model", ",".join(FAMILIES), "--method", ",".join(METHODS), "--p", "0.5,0.1", "--dtype", "float32"]
    runs = {
        "ruler": ["--bench", "ruler", "--task", "niah_single_1", "--limit", "2"],
    }
    result: dict = {"grid": " ".join(grid), "runs": {}}
    rows: dict = {}
    out.mkdir(parents=True, exist_ok=True)
    for dev in dict.fromkeys((device, "cpu")):
        for bench, extra in runs.items():
            d = out / f"run-{dev.replace(':', '')}"
            log = out / f"run-{dev}-{bench}.log"
            rc, secs = _kvbench(["run", *grid, *extra, "--device", dev, "--out", str(d)], log)
            result["runs"][f"{dev}/{bench}"] = {"rc": rc, "seconds": secs}
        path = out / f"run-{dev.replace(':', '')}" / "results.jsonl"
        rows[dev] = [msgspec.json.decode(line) for line in path.read_bytes().splitlines()] if path.exists() else []
    key = lambda r: (r["model"], r["method"], r.get("allocation"), r["p"], r["task"], r["item"], r.get("question", 0))  # noqa: E731
    on_dev = {key(r): r for r in rows[device]}
    on_cpu = {key(r): r for r in rows["cpu"]}
    shared = sorted(set(on_dev) & set(on_cpu), key=str)
    same = sum(on_dev[k]["prediction"] == on_cpu[k]["prediction"] for k in shared)
    result["rows"] = {device: len(on_dev), "cpu": len(on_cpu), "compared": len(shared), "identical_predictions": same}
    result["differing"] = [list(map(str, k)) for k in shared if on_dev[k]["prediction"] != on_cpu[k]["prediction"]][:20]
    result["ok"] = all(r["rc"] == 0 for r in result["runs"].values()) and len(shared) == len(on_dev) > 0
    return result


def _tiny_vllm_checkpoint(family: str, root: Path) -> tuple[str, object]:
    """A tiny random bfloat16 checkpoint of ``family`` in vLLM's reach (GDN head dims 64, untied embeddings; the
    MoE Qwen3-Next routes every token to all experts), saved under ``root``; returns its path and tokenizer."""
    import torch

    from kvbench.models import build_random, load_model, tiny_vllm_config

    tokenizer = load_model("tiny-trained", dtype="bfloat16").tokenizer
    config = tiny_vllm_config(family, len(tokenizer))
    config.pad_token_id, config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    path = root / f"vllm-{family}"
    build_random(config, seed=0).to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), tokenizer


def _vllm_family(family: str, device: str, out: Path) -> dict:
    import torch
    import vllm

    from kvbench import selection
    from kvbench.engines.vllm_engine import VllmEngine

    path, tokenizer = _tiny_vllm_checkpoint(family, out)
    ids = torch.randint(3, 250, (700,), generator=torch.Generator().manual_seed(0)).tolist()
    question = [17, 23, 5, 99, 42, 7, 31]
    rec: dict = {"family": family, "seconds": {}}
    options = {"mamba_ssm_cache_dtype": "float32"}  # fp32 SSM state: the GPU backends' strictest kernel-block case
    t0 = time.perf_counter()
    engine = VllmEngine(path, tokenizer, max_model_len=1024, device=device, llm_options=options)
    rec["seconds"]["start"] = round(time.perf_counter() - t0, 2)
    try:
        p = engine.paging
        rec["paging"] = {"manager_block": p.manager_block, "kernel_block": p.kernel_block, "ratio": p.ratio,
                         "stride": p.row_stride, "head_major": engine.head_major}  # fmt: skip
        with _timed(rec["seconds"], "prefill", device):
            parent = engine.prefill(ids, prot=4, query_window=16)
        sig = parent.signals()
        hv = sig.g[0].shape[1]
        rec["gdn_signal_shapes_ok"] = all(
            t.shape == (len(ids), hv) for ts in (sig.g, sig.beta, sig.vnorm) for t in ts
        ) and all(bool(torch.isfinite(t).all()) for t in sig.g)
        ask = dict(max_new_tokens=8, context_sha256=parent.sha256, stop_ids=[], return_logits=True)
        with _timed(rec["seconds"], "answer", device):
            want = parent.answer(question, **ask)
        mine = torch.log_softmax(want.step_logits[0].float(), -1)
        params = vllm.SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, logprobs=20)
        gen = engine.llm.generate([{"prompt_token_ids": ids + question}], params, use_tqdm=False)
        theirs = {t: lp.logprob for t, lp in gen[0].outputs[0].logprobs[0].items()}
        rec["first_step_vs_generate"] = {
            "top5_shared": len(set(mine.topk(5).indices.tolist()) & set(sorted(theirs, key=theirs.get)[-5:])),
            "max_logprob_diff": round(max(abs(mine[t].item() - lp) for t, lp in theirs.items()), 4),
        }
        keep = selection.keep_all(parent.n, parent.n_attn_layers, parent.n_kv_heads)
        for path_name, force in (("normal", False), ("per_head", True)):
            engine.force_head_pages = force
            with _timed(rec["seconds"], f"fork_{path_name}", device):
                child = parent.fork(keep)
            got = child.answer(question, **ask)
            rec[f"keep_all_{path_name}_identical"] = got.token_ids == want.token_ids
            rec[f"keep_all_{path_name}_logits_equal"] = bool(torch.equal(got.step_logits, want.step_logits))
            child.release()
        engine.force_head_pages = False
        parent.release()
        if device.startswith("cuda"):
            rec["peak_gpu_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    finally:
        engine.close()
    rec["ok"] = bool(rec["gdn_signal_shapes_ok"] and rec["keep_all_normal_identical"]
                     and rec["keep_all_per_head_identical"] and rec["first_step_vs_generate"]["top5_shared"] >= 4
                     and rec["first_step_vs_generate"]["max_logprob_diff"] <= 0.15)  # fmt: skip
    return rec


def check_vllm(device: str, out: Path) -> dict:
    """The vllm engine on ``device`` for both families, when a vLLM at the pinned version is importable."""
    try:
        import vllm
    except Exception as exc:  # noqa: BLE001 - any import failure means the part cannot run
        return {"status": "not run", "why": f"vLLM is not importable here ({type(exc).__name__}: {exc}); "
                f"the check needs vLLM {PINNED_VLLM} for this device installed beside kvbench"}  # fmt: skip
    version = getattr(vllm, "__version__", "?")
    if not version.startswith(PINNED_VLLM):
        return {"status": "not run", "why": f"vLLM {version} is installed; kvbench's engine is pinned to {PINNED_VLLM}"}
    result: dict = {"version": version}
    for family in ("qwen3_5", "qwen3_next"):  # dense first: vLLM keeps one distributed state per process
        result[family] = _vllm_family(family, device, out)
    result["ok"] = all(result[f]["ok"] for f in ("qwen3_5", "qwen3_next"))
    return result


def _env(device: str) -> dict:
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "cpu_threads": torch.get_num_threads(), "device": device}  # fmt: skip
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        with contextlib.suppress(Exception):
            env["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--items", type=int, default=2, help="RULER contexts per family in the torch-engine part")
    parser.add_argument("--parts", default="torch_engine,kvbench_run,vllm")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    verdict: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "env": _env(args.device)}
    parts = args.parts.split(",")
    t_all = time.perf_counter()

    def part(name: str, fn) -> None:
        t0 = time.perf_counter()
        try:
            verdict[name] = fn()
        except Exception:  # noqa: BLE001 - recorded in the verdict, the other parts still run
            verdict[name] = {"ok": False, "error": traceback.format_exc(limit=12)}
        verdict[name]["seconds"] = round(time.perf_counter() - t0, 1)
        (args.out / "gpu_check.json").write_text(json.dumps(verdict, indent=1, default=str))
        print(f"gpu_check: {name} done in {verdict[name]['seconds']} s, ok={verdict[name].get('ok')}", flush=True)

    if "torch_engine" in parts:
        for model in FAMILIES:
            part(f"torch_engine/{model}", lambda m=model: check_torch_engine(m, args.device, args.items))
    if "kvbench_run" in parts:
        part("kvbench_run", lambda: check_kvbench_run(args.device, args.out))
    if "vllm" in parts:
        part("vllm", lambda: check_vllm(args.device, args.out))
    checked = [v for k, v in verdict.items() if isinstance(v, dict) and "ok" in v]
    verdict["seconds"] = round(time.perf_counter() - t_all, 1)
    verdict["ok"] = bool(checked) and all(v["ok"] for v in checked)
    (args.out / "gpu_check.json").write_text(json.dumps(verdict, indent=1, default=str))
    print(json.dumps({k: (v.get("ok") if isinstance(v, dict) else v) for k, v in verdict.items() if k != "env"}))
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
