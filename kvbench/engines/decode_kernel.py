"""kvbench's decode kernels: the two parts of a decoding step that PyTorch runs far below memory speed on CPU.

**Attention** (:func:`decode_attention`, :func:`decode_step`). A decoding step reads every kept entry of every
answering child once. PyTorch's CPU SDPA streams them at about 10 GB/s on the 2-core machines kvbench is developed
on (the folded-GQA single-query shape is neither its bandwidth- nor its compute-optimal case); this kernel streams
them at 25-30 GB/s (``python benchmarks/decode_attention.py``). Its arithmetic per KV head depends only on that
head's query rows and entries: a child answering alone and the same child in a batch get bit-identical attention.

**GDN step** (:func:`gdn_step`). transformers' one-token gated delta rule makes about six passes over every
recurrent state (``[Hv, Dk, Dv]`` per row); a batched step's states do not fit in cache, so it runs at memory
speed several times over. The kernel reads each state once and writes it once, row by row.

Both are used for every float32 CPU decoding step of the torch engine, alone and batched alike (the attention
through ``kvbench_sdpa`` and ``BatchKV``, the GDN step through :meth:`HybridAdapter.decode_kernels
<kvbench.engines.hf_adapters.HybridAdapter.decode_kernels>` while children answer). Prefill, question blocks,
scoring passes, other dtypes and devices keep PyTorch's and transformers' code.

The C file (``decode_attention.c``) is compiled on first use with the machine's C compiler (``$CC``, else ``gcc``,
else ``cc``; ``-O3 -march=native``, OpenMP against the libgomp torch itself loaded, so it uses torch's threads)
into ``$KVBENCH_CACHE/kernels`` (default ``~/.cache/kvbench/kernels``), keyed by the source, the flags, the
compiler and the CPU. ``KVBENCH_DECODE_KERNEL=0`` turns both off (PyTorch everywhere, the numerics of earlier
releases); without a working compiler they are off too, and :func:`status` says why (the run manifest records
it, and the first use logs a warning naming the fix).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import torch

from kvbench.atomic import write_with
from kvbench.cache import cache_dir

__all__ = ["DecodeJobs", "applies", "available", "decode_attention", "decode_step", "gdn_step", "status"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_attention.c")
FLAGS = ["-O3", "-march=native", "-std=gnu11", "-fPIC", "-shared", "-fopenmp"]
#: :func:`status` when ``KVBENCH_DECODE_KERNEL=0`` turned the kernels off on purpose (no warning then).
OFF = "pytorch (KVBENCH_DECODE_KERNEL=0)"
_P = ctypes.c_void_p
_I = ctypes.c_int64


class _Kernel:
    def __init__(self, path: Path) -> None:
        self.lib = ctypes.CDLL(str(path))
        self.lib.kvb_path.restype = ctypes.c_char_p
        self.path = self.lib.kvb_path().decode()
        self.fn = self.lib.kvb_decode_attention
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [_P] * 9 + [_I] * 3 + [ctypes.c_float]
        self.gdn = self.lib.kvb_gdn_step
        self.gdn.restype = None
        self.gdn.argtypes = [_P] * 8 + [_I] * 3


def _cpu_id() -> str:
    try:
        flags = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith(("flags", "model name"))]
    except OSError:
        flags = []
    return platform.machine() + "|" + "|".join(sorted(set(flags)))


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _build(cc: str, flags: Sequence[str] = FLAGS) -> Path:
    """Compile (or find compiled) the kernel; raises ``RuntimeError`` with the compiler's message on failure."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha256(
        "\n".join([SOURCE.read_text(), " ".join(flags), cc, *version, _cpu_id()]).encode()
    ).hexdigest()[:16]
    out_dir = cache_dir() / "kernels"
    target = out_dir / f"decode_attention-{key}.so"
    if target.exists():
        return target

    def compile_to(tmp: Path) -> None:
        done = subprocess.run([cc, *flags, str(SOURCE), "-o", str(tmp), "-lm"], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-2000:]}")

    write_with(target, compile_to, mode=0o755)  # concurrent builders each write their own file, one wins
    return target


@lru_cache(maxsize=1)
def _load() -> tuple[_Kernel | None, str]:
    if os.environ.get("KVBENCH_DECODE_KERNEL", "1").strip().lower() in ("0", "off", "false", "no"):
        return None, OFF
    cc = _compiler()
    if cc is None:
        return None, (
            "pytorch (no C compiler found: install gcc or set CC to use kvbench's decode kernels, or set "
            "KVBENCH_DECODE_KERNEL=0 to decode with PyTorch without this warning)"
        )
    errors = []
    for flags in (FLAGS, [f for f in FLAGS if f != "-fopenmp"]):  # a compiler without OpenMP: one thread
        try:
            kernel = _Kernel(_build(cc, flags))
        except (OSError, RuntimeError) as e:
            errors.append(str(e))
            continue
        return kernel, f"kvbench-c ({kernel.path}{'' if '-fopenmp' in flags else ', one thread: no OpenMP'})"
    return None, (
        f"pytorch (kvbench's decode kernels failed to build or load: {errors[0]}; fix the C compiler or point CC at "
        "a working one, or set KVBENCH_DECODE_KERNEL=0 to decode with PyTorch without this warning)"
    )


def status() -> str:
    """What float32 CPU decoding steps run on: ``"kvbench-c (avx512)"``, ``"kvbench-c (generic)"``, or
    ``"pytorch (<why>)"`` (PyTorch's SDPA and transformers' GDN step)."""
    return _load()[1]


_warned = False


def available() -> bool:
    """Whether the kernels are built and on (see the module docstring). The first ``False`` logs a warning saying
    why, unless it was turned off on purpose."""
    global _warned
    kernel, why = _load()
    if kernel is None and not _warned and why != OFF:
        log.warning("decode steps use %s", why)
        _warned = True
    return kernel is not None


class DecodeJobs:
    """Where each job's entries lie for :func:`decode_attention`: ``J`` jobs (one KV head of one sequence each)
    whose entries are rows of ``D`` float32 at ``keys[j]`` / ``values[j]`` (addresses), ``n1[j]`` of them, then
    ``n2[j]`` from row ``off2[j]`` on. All ``[J]`` int64 CPU tensors; hold the tensors the addresses point into
    alive for as long as the jobs are used."""

    __slots__ = ("keys", "values", "n1", "off2", "n2")

    def __init__(self, keys, values, n1, off2, n2) -> None:
        as_i64 = lambda x: torch.as_tensor(x, dtype=torch.int64).contiguous()  # noqa: E731
        self.keys, self.values, self.n1, self.off2, self.n2 = map(as_i64, (keys, values, n1, off2, n2))

    @classmethod
    def heads(cls, keys: torch.Tensor, values: torch.Tensor) -> DecodeJobs:
        """One job per KV head of ``keys`` / ``values`` ``[H_kv, n, D]`` (rows contiguous), all ``n`` entries."""
        h, n, _ = keys.shape
        return cls(_row_addresses(keys, h), _row_addresses(values, h), [n] * h, [0] * h, [0] * h)


def _row_addresses(t: torch.Tensor, count: int) -> list[int]:
    """Addresses of ``t[i, 0]`` for ``i < count`` (``t`` float32 with contiguous rows)."""
    if t.stride(-1) != 1 or t.stride(-2) != t.shape[-1]:
        raise ValueError("the decode-attention kernel needs rows of D contiguous floats")
    return [t.data_ptr() + i * t.stride(0) * t.element_size() for i in range(count)]


def decode_attention(
    query: torch.Tensor,
    jobs: DecodeJobs,
    scale: float,
    new_keys: torch.Tensor | None = None,
    new_values: torch.Tensor | None = None,
    kernel: _Kernel | None = None,
) -> torch.Tensor:
    """One query row per query head attends to its job's entries. query ``[J, nq, D]`` float32 (the ``nq`` query
    heads sharing job ``j``'s KV head); returns ``[J, nq, D]``. With ``new_keys`` / ``new_values`` ``[J, D]`` they
    are first written at row ``off2 + n2`` of each job and attended as its last entry (the caller then counts them
    in ``n2``). Call only when :func:`available` (``kernel``: another build of it, for tests)."""
    kernel = kernel or _load()[0]
    if kernel is None:
        raise RuntimeError(f"the decode-attention kernel is off: {status()}")
    J, nq, D = query.shape
    if query.dtype != torch.float32 or query.device.type != "cpu":
        raise ValueError("the decode-attention kernel runs float32 on CPU only")
    if len(jobs.n1) != J:
        raise ValueError(f"{J} query jobs for {len(jobs.n1)} entry jobs")
    query = query.contiguous()
    out = torch.empty_like(query)
    fed = (None, None)
    if new_keys is not None:
        fed = (new_keys.reshape(J, D).contiguous(), new_values.reshape(J, D).contiguous())
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    rc = kernel.fn(
        query.data_ptr(), *(ptr(t) for t in (jobs.keys, jobs.values, jobs.n1, jobs.off2, jobs.n2)),
        ptr(fed[0]), ptr(fed[1]), out.data_ptr(), J, nq, D, float(scale),
    )  # fmt: skip
    if rc != 0:
        raise MemoryError("the decode-attention kernel could not allocate its scratch memory")
    return out


def applies(query: torch.Tensor) -> bool:
    """Whether queries ``[B, H, q, D]`` are a decoding step the kernel attends: one query, float32, CPU, kernel
    available. The torch engine asks this in the same way for a child alone and for a batch of children."""
    return query.shape[2] == 1 and query.dtype == torch.float32 and query.device.type == "cpu" and available()


def decode_step(
    query: torch.Tensor,
    jobs: DecodeJobs,
    scale: float | None,
    new_keys: torch.Tensor | None = None,
    new_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`decode_attention` for a model's decoding step: query ``[B, H, 1, D]``, ``jobs`` one per (row, KV
    head) in that order, ``new_keys`` / ``new_values`` ``[B, H_kv, 1, D]`` or None; ``scale`` None means
    ``D ** -0.5``. Returns ``[B, H, 1, D]``."""
    B, H, _, D = query.shape
    J = len(jobs.n1)
    scale = D**-0.5 if scale is None else scale
    return decode_attention(query.reshape(J, B * H // J, D), jobs, scale, new_keys, new_values).reshape(B, H, 1, D)


def gdn_step(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    use_qk_l2norm_in_kernel: bool = False,
    kernel: _Kernel | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One fed token of a GDN layer's gated delta rule, as transformers' ``torch_recurrent_gated_delta_rule`` with
    one token computes it (the same preparation: value heads served by grouped query/key heads, optional L2
    normalisation, queries divided by ``sqrt(Dk)``), the recurrence by the kernel (``kvb_gdn_step``: each state read
    from memory once and written once, where the reference makes about six passes over it).

    query / key ``[B, 1, Hk, Dk]``, value ``[B, 1, Hv, Dv]``, g / beta ``[B, 1, Hv]``, initial_state ``[B, Hv, Dk,
    Dv]`` (not written); float32 on CPU. Returns the output ``[B, 1, Hv, Dv]`` and the new state."""
    kernel = kernel or _load()[0]
    if kernel is None:
        raise RuntimeError(f"the decode kernels are off: {status()}")
    B, T, Hk, Dk = key.shape
    Hv, Dv = value.shape[-2:]
    if T != 1 or query.dtype != torch.float32 or initial_state.dtype != torch.float32:
        raise ValueError("the GDN step kernel takes one float32 token")
    if Hk != Hv:
        query, key = (x.repeat_interleave(Hv // Hk, dim=2) for x in (query, key))
    if use_qk_l2norm_in_kernel:
        query, key = (x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6) for x in (query, key))
    query = query / (Dk**0.5)
    q, k, v = (x.reshape(B * Hv, -1).contiguous() for x in (query, key, value))
    g_, beta_ = (x.reshape(B * Hv).float().contiguous() for x in (g, beta))
    state_in = initial_state.contiguous()
    state_out = torch.empty_like(state_in)
    out = torch.empty(B, 1, Hv, Dv, dtype=torch.float32)
    kernel.gdn(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), g_.data_ptr(), beta_.data_ptr(), state_in.data_ptr(),
        state_out.data_ptr(), out.data_ptr(), B * Hv, Dk, Dv,
    )  # fmt: skip
    return out, state_out
