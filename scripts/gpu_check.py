"""The GPU check: kvbench's engines on a CUDA device, one JSON verdict (``bash scripts/gpu_check.sh`` runs it).

Every part runs in a process of its own (``--run-part NAME``), with a time limit and its own environment, and writes
its own record; the verdict (``OUT/gpu_check.json``) gathers them, so a part that raises, hangs or cannot start
keeps every other part's record and fails the verdict. The parts, in order (``--parts all`` or a comma list):

* ``torch_engine/<model>`` (``tiny-trained``: Qwen3-Next MoE, ``tiny-trained-dense``: Qwen3.5), in float32 on the
  device and, as the reference, on this machine's CPU: RULER-4096 contexts prefilled on both; the parent's greedy
  answer on the device against the CPU's; a keep-all child against its parent (the protocol's identity); every
  method's kept set at p = 0.1 against the CPU's (overlap); a flat and a ragged child answering alone and batched;
  prefill / score / fork / answer seconds and the device's peak memory.
* ``fast_kernels``: the GDN capture with the fast kernels importable, against the same prefill without them (two
  child processes). On CUDA the flash-linear-attention wheels carried in ``scripts/gpu_check_wheels/`` (pure Python
  over Triton) and causal-conv1d if installed: every call captured, the first GDN layer's β, g, ‖v‖ identical (its
  inputs do not depend on any kernel), the later layers within 2e-2. On CPU stand-ins with the packages' import
  paths and signatures, delegating to the torch reference (tests/test_fast_kernels.py): identical bit for bit.
* ``kvbench_run``: ``kvbench run`` end to end on both models (every built-in method, two kept fractions, RULER
  niah_single_1), on the device and on the CPU: rows written, and the share of identical predictions.
* ``shape_twins/<family>``: ``scripts/shape_twins.py check`` at ``--twin-length`` tokens (default 16,384 on CUDA)
  on the shape twins of Qwen3-Next-80B-A3B and Qwen3.5-27B: keep-all conformance, every method's scoring seconds,
  peak memory.
* ``vllm/<family>`` (the project's ``.venv-vllm`` python, ``--vllm-python``): the vllm engine at vLLM's default KV
  layout (signals, first step against ``LLM.generate``, keep-all fork); the per-head fork only where that layout is
  head-major. ``vllm_hnd/qwen3_5``: a second engine start with ``VLLM_KV_CACHE_LAYOUT=HND``, the per-head fork
  (``global`` allocation) forced. A vLLM part that could not run (no such python, vLLM not importable or not the
  pinned version) fails the verdict unless ``--allow-missing vllm``.

The whole check keeps within ``--budget-s`` (480 s on CUDA): each part's limit is the smaller of its own and what
is left; a part with too little left is recorded as not run (a failure). ``--device cpu`` runs every part with the
CPU on both sides (a dry run of this script; its numbers say nothing about GPUs).

    python scripts/gpu_check.py --out DIR [--device cuda] [--items 2] [--parts all] [--allow-missing vllm]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
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
RUN_TIMEOUT_S = 300  # each `kvbench run` of the check (about 60 s on a GPU machine's 16 cores, so 5x margin)
ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / "scripts" / "gpu_check_wheels"  # fetched (git-ignored), carried to the GPU machine
#: the pure-Python fast-kernel wheels the fast_kernels part installs on CUDA (Triton comes with the CUDA torch)
FLA_WHEELS = ("fla-core==0.6.0", "flash-linear-attention==0.6.0", "einops==0.8.2")
TWINS = ("shape:Qwen/Qwen3-Next-80B-A3B-Instruct", "shape:Qwen/Qwen3.5-27B")
RAISE_ENV = "KVBENCH_GPU_CHECK_RAISE"  # a part name: that part raises at its start (tests/test_gpu_check_parts.py)
HANG_ENV = "KVBENCH_GPU_CHECK_HANG"  # a part name: that part starts a child (its pid in OUT/hang.pid) and hangs


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


def _kvbench(args: list[str], log: Path, timeout: float) -> tuple[int, float]:
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        try:
            rc = subprocess.call([sys.executable, "-P", "-c", "from kvbench.cli import main; main()", *args],
                                 stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)  # fmt: skip
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, round(time.perf_counter() - t0, 1)


def check_kvbench_run(device: str, out: Path, scale: float) -> dict:
    """``kvbench run`` end to end on both models, on ``device`` and on the CPU; rows compared by identity. Each
    run's limit: ``RUN_TIMEOUT_S`` times ``scale`` (the check's ``--limit-scale``)."""
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
            rc, secs = _kvbench(["run", *grid, *extra, "--device", dev, "--out", str(d)], log, RUN_TIMEOUT_S * scale)
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


def _vllm_family(family: str, device: str, out: Path, per_head: str) -> dict:
    """The vllm engine on one tiny ``family`` checkpoint. ``per_head``: ``"if-head-major"`` (vLLM's default layout:
    the per-head fork is tested only where the cache layout allows it) or ``"forced"`` (the HND start: the layout must
    be head-major and the per-head fork is tested)."""
    import torch
    import vllm

    from kvbench import selection
    from kvbench.engines.vllm_engine import VllmEngine

    path, tokenizer = _tiny_vllm_checkpoint(family, out)
    ids = torch.randint(3, 250, (700,), generator=torch.Generator().manual_seed(0)).tolist()
    question = [17, 23, 5, 99, 42, 7, 31]
    rec: dict = {"family": family, "seconds": {}, "vllm": vllm.__version__,
                 "kv_cache_layout": os.environ.get("VLLM_KV_CACHE_LAYOUT", "(vLLM's default)")}  # fmt: skip
    options = {"mamba_ssm_cache_dtype": "float32"}  # fp32 SSM state: the GPU backends' strictest kernel-block case
    t0 = time.perf_counter()
    engine = VllmEngine(path, tokenizer, max_model_len=1024, device=device, llm_options=options)
    rec["seconds"]["start"] = round(time.perf_counter() - t0, 2)
    try:
        p = engine.paging
        rec["paging"] = {"manager_block": p.manager_block, "kernel_block": p.kernel_block, "ratio": p.ratio,
                         "stride": p.row_stride, "head_major": engine.head_major}  # fmt: skip
        rec["model_runner"] = engine.model_runner  # which runner ran (module.class; V1 pinned)
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
        paths = [("normal", False)]
        if per_head == "forced" or engine.head_major:
            paths.append(("per_head", True))
        else:
            rec["keep_all_per_head"] = "not tested: this layout is token-major (the HND part tests it)"
        for path_name, force in paths:
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
                     and (per_head != "forced" or rec["kv_cache_layout"] == "HND")
                     and rec.get("keep_all_per_head_identical", per_head != "forced")
                     and (per_head != "forced" or rec["paging"]["head_major"])
                     and rec["first_step_vs_generate"]["top5_shared"] >= 4
                     and rec["first_step_vs_generate"]["max_logprob_diff"] <= 0.15)  # fmt: skip
    return rec


def vllm_missing(python: str) -> str | None:
    """Why the vLLM parts cannot run with ``python`` (None: they can)."""
    if not Path(python).exists():
        return f"no vLLM python at {python} (build it with `bash scripts/setup_vllm.sh`, or pass --vllm-python)"
    code = "import vllm, sys; print(vllm.__version__)"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return f"importing vLLM with {python} took over 180 s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"vLLM is not importable with {python} ({last[:200]})"
    version = done.stdout.strip()
    if not version.startswith(PINNED_VLLM):
        return f"vLLM {version} is installed with {python}; kvbench's engine is pinned to {PINNED_VLLM}"
    return None


FAST_CHILD = r"""
import json, sys, torch
mode, device, out = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "reference":  # transformers' torch path even where the kernels are installed
    sys.modules["fla"] = sys.modules["causal_conv1d"] = None
from kvbench.engines.torch_engine import TorchEngine
from kvbench.models import build_random, byte_tokenizer, tiny_qwen3_next_config
model = build_random(tiny_qwen3_next_config(moe=True), seed=3).to(device)
ids = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(1)).tolist()
parent = TorchEngine(model, byte_tokenizer()).prefill(ids, prot=4, query_window=8)
sig = parent.signals()
torch.save({"beta": [t.cpu() for t in sig.beta], "g": [t.cpu() for t in sig.g],
            "vnorm": [t.cpu() for t in sig.vnorm], "fla_imported": sys.modules.get("fla") is not None,
            "conv_imported": sys.modules.get("causal_conv1d") is not None}, out)
"""

STANDINS = {
    "fla/__init__.py": "from . import ops\n",
    "fla/ops/__init__.py": "from . import gated_delta_rule\n",
    "fla/ops/gated_delta_rule/__init__.py": (
        "import inspect, sys\n"
        "def _ref(name):\n"
        "    return inspect.unwrap(getattr(sys.modules['transformers.models.qwen3_next.modeling_qwen3_next'], name))\n"
        "def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,\n"
        "                           use_qk_l2norm_in_kernel=False, cu_seqlens=None):\n"
        "    return _ref('torch_chunk_gated_delta_rule')(q, k, v, g=g, beta=beta, initial_state=initial_state,\n"
        "        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)\n"
        "def fused_recurrent_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None,\n"
        "        output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None):\n"
        "    return _ref('torch_recurrent_gated_delta_rule')(q, k, v, g=g, beta=beta, initial_state=initial_state,\n"
        "        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)\n"
    ),
}


def check_fast_kernels(device: str, out: Path) -> dict:
    """The GDN capture with the fast kernels importable against the same prefill without them (see the docstring)."""
    import torch

    work = out / "fast_kernels"
    site = work / "site"
    site.mkdir(parents=True, exist_ok=True)
    if device.startswith("cuda"):
        wheels = sorted(WHEELS.glob("*.whl"))
        if not wheels:
            return {"ok": False, "error": f"no flash-linear-attention wheels in {WHEELS}; fetch them where the "
                    f"network is reachable: pip download --no-deps -d {WHEELS} {' '.join(FLA_WHEELS)}"}
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
                        str(site), *map(str, wheels)], check=True, timeout=120)  # fmt: skip
        kind = "flash-linear-attention " + ", ".join(w.name for w in wheels)
    else:
        for rel, text in STANDINS.items():
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_text(text)
        kind = "stand-ins delegating to the torch reference (CPU)"
    runs = {}
    for mode in ("reference", "fast"):
        env = dict(os.environ)
        if mode == "fast":
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
        target = work / f"{mode}.pt"
        done = subprocess.run([sys.executable, "-c", FAST_CHILD, mode, device, str(target)], env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the {mode} prefill failed: {done.stderr[-2500:]}")
        runs[mode] = torch.load(target, weights_only=False)
    ref, fast = runs["reference"], runs["fast"]
    rec: dict = {"kernels": kind, "fla_imported": fast["fla_imported"], "reference_fla_imported": ref["fla_imported"]}
    first = all(torch.equal(ref[k][0], fast[k][0]) for k in ("beta", "g", "vnorm"))
    pairs = [(a, b) for k in ("beta", "g", "vnorm") for a, b in zip(ref[k], fast[k], strict=True)]
    diff = max(float((a - b).abs().max()) for a, b in pairs)
    exact = all(torch.equal(a, b) for a, b in pairs)
    rec.update(first_gdn_layer_identical=first, all_identical=exact, max_abs_diff=diff)
    tolerance_ok = exact if not device.startswith("cuda") else (first and diff <= 2e-2)
    rec["ok"] = bool(fast["fla_imported"] and not ref["fla_imported"] and tolerance_ok)
    return rec


def check_shape_twin(model: str, device: str, length: int, out: Path) -> dict:
    """``scripts/shape_twins.py check`` on one shape twin (its own process: the torch part's python)."""
    target = out / f"shape-{model.split('/')[-1]}.json"
    dtype = ["--dtype", "bfloat16"] if device.startswith("cuda") else []
    done = subprocess.run([sys.executable, str(ROOT / "scripts/shape_twins.py"), "check", "--model", model,
                           "--length", str(length), "--device", device, *dtype, "--out", str(target)],
                          capture_output=True, text=True)  # fmt: skip
    if not target.is_file():
        raise RuntimeError(f"shape_twins.py check wrote nothing (rc {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(target.read_text())


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


TORCH, VLLM = "torch", "vllm"


#: environment variables a part's process gets on top of the check's (the HND part: a head-major KV cache layout)
PART_ENV = {"vllm_hnd/qwen3_5": {"VLLM_KV_CACHE_LAYOUT": "HND"}}


def limit_scale(args) -> float:
    """What every part's limit is multiplied by: ``--limit-scale``, else 1 on CUDA and 4 on a CPU dry run."""
    return args.limit_scale or (1.0 if args.device.startswith("cuda") else 4.0)


def part_table(args) -> list[tuple[str, str, int, object]]:
    """(name, environment, limit in seconds, what it runs) for every part, in order."""
    twin_len = args.twin_length or (16384 if args.device.startswith("cuda") else 1024)
    table = [(f"torch_engine/{m}", TORCH, 240, lambda m=m: check_torch_engine(m, args.device, args.items))
             for m in FAMILIES]  # fmt: skip
    table.append(("fast_kernels", TORCH, 300, lambda: check_fast_kernels(args.device, args.out)))
    scale = limit_scale(args)
    table.append(("kvbench_run", TORCH, 2 * RUN_TIMEOUT_S + 30,
                  lambda: check_kvbench_run(args.device, args.out, scale)))  # fmt: skip
    for m in TWINS:
        table.append(
            (
                f"shape_twins/{m.split('/')[-1]}",
                TORCH,
                420,
                lambda m=m: check_shape_twin(m, args.device, twin_len, args.out),
            )
        )
    for fam in ("qwen3_5", "qwen3_next"):  # dense first
        table.append((f"vllm/{fam}", VLLM, 300, lambda f=fam: _vllm_family(f, args.device, args.out, "if-head-major")))
    table.append(("vllm_hnd/qwen3_5", VLLM, 300, lambda: _vllm_family("qwen3_5", args.device, args.out, "forced")))
    return table


def _run_group(cmd: list[str], log, env: dict, timeout: float) -> int | str:
    """Run a part's process in a process group of its own; past ``timeout`` seconds the whole group is killed (a
    part's own children too, e.g. `kvbench run` or shape_twins.py, which would otherwise outlive it and hold the
    memory the next part needs). Returns the exit status, or ``"timeout"``."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "timeout"


def _record_file(out: Path, name: str) -> Path:
    return out / "parts" / (name.replace("/", "__") + ".json")


def _write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)


def run_part(args) -> int:
    """Child process: run one part, write its record (a raised exception is recorded too)."""
    fn = {name: fn for name, _, _, fn in part_table(args)}[args.run_part]
    t0 = time.perf_counter()
    try:
        if os.environ.get(RAISE_ENV) == args.run_part:
            raise RuntimeError(f"{args.run_part} made to raise ({RAISE_ENV})")
        if os.environ.get(HANG_ENV) == args.run_part:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            (args.out / "hang.pid").write_text(str(child.pid))
            time.sleep(600)
        rec = fn()
    except Exception:  # noqa: BLE001 - recorded; the parent still gathers the other parts
        rec = {"ok": False, "error": traceback.format_exc(limit=12)}
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    rec["env"] = _env(args.device)
    _write_json(_record_file(args.out, args.run_part), rec)
    return 0 if rec.get("ok") else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--items", type=int, default=2, help="RULER contexts per family in the torch-engine parts")
    parser.add_argument("--parts", default="all", help="all, or part names / prefixes (torch_engine, vllm, …)")
    parser.add_argument("--allow-missing", default="", help="vllm: a vLLM part that cannot run does not fail")
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--budget-s", type=float, default=None, help="whole-check limit (default 480 on CUDA)")
    parser.add_argument("--twin-length", type=int, default=None, help="shape-twin tokens (16384 on CUDA, 1024 on CPU)")
    parser.add_argument("--limit-scale", type=float, default=None,
                        help="multiply every part's limit (default 1 on CUDA, 4 on a CPU dry run)")  # fmt: skip
    parser.add_argument("--run-part", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.run_part:
        return run_part(args)
    budget = args.budget_s if args.budget_s is not None else (480.0 if args.device.startswith("cuda") else 0.0)
    wanted = [p.strip() for p in args.parts.split(",") if p.strip()]
    chosen = lambda name: "all" in wanted or any(name == w or name.startswith((w + "/", w + "_")) for w in wanted)  # noqa: E731
    table = [row for row in part_table(args) if chosen(row[0])]
    if not table:
        raise SystemExit(f"gpu_check: --parts {args.parts!r} names no part; see --help")
    verdict: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": args.device,
                     "budget_s": budget or None, "parts": {}}  # fmt: skip
    t_all = time.perf_counter()
    missing_vllm = vllm_missing(args.vllm_python) if any(env == VLLM for _, env, _, _ in table) else None

    def save() -> None:
        verdict["seconds"] = round(time.perf_counter() - t_all, 1)
        _write_json(args.out / "gpu_check.json", verdict)

    scale = limit_scale(args)
    for name, env_kind, limit, _ in table:
        limit = limit * scale
        left = budget - (time.perf_counter() - t_all) if budget else limit
        record = _record_file(args.out, name)
        record.unlink(missing_ok=True)
        if env_kind == VLLM and missing_vllm:
            allowed = "vllm" in args.allow_missing.split(",")
            rec = {"ok": None if allowed else False, "status": "not run", "why": missing_vllm}
        elif left < 20:
            rec = {"ok": False, "status": "not run", "why": f"the check's {budget:.0f} s budget is spent"}
        else:
            python = args.vllm_python if env_kind == VLLM else sys.executable
            env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", **PART_ENV.get(name, {}))
            if env_kind == VLLM:  # its own environment: not the torch part's packages (transformers 5.24)
                env["PYTHONPATH"] = str(ROOT)
            cmd = [python, str(Path(__file__).resolve()), "--run-part", name, "--device", args.device,
                   "--out", str(args.out), "--items", str(args.items)]  # fmt: skip
            if args.twin_length:
                cmd += ["--twin-length", str(args.twin_length)]
            if args.limit_scale:
                cmd += ["--limit-scale", str(args.limit_scale)]
            log = args.out / "parts" / (name.replace("/", "__") + ".log")
            log.parent.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            with open(log, "w") as fh:
                rc = _run_group(cmd, fh, env, min(limit, left))
            if record.is_file():
                rec = json.loads(record.read_text())
            else:
                tail = log.read_text(errors="replace")[-3000:]
                rec = {"ok": False, "error": f"the part's process ended without a record (rc {rc}): {tail}"}
            rec.setdefault("seconds", round(time.perf_counter() - t0, 1))
            if rc == "timeout":
                rec.update(ok=False, status=f"timed out after {min(limit, left):.0f} s")
        verdict["parts"][name] = rec
        save()
        print(f"gpu_check: {name} ok={rec.get('ok')} in {rec.get('seconds', 0)} s", flush=True)
    counted = [r for r in verdict["parts"].values() if r.get("ok") is not None]
    verdict["ok"] = bool(counted) and all(r["ok"] for r in counted)
    save()
    print(json.dumps({"ok": verdict["ok"], "seconds": verdict["seconds"],
                      "parts": {k: v.get("ok") for k, v in verdict["parts"].items()}}))  # fmt: skip
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
