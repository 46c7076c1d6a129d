"""kvbench's decode-attention kernel: single-query attention on CPU in float32, at memory speed.

A decoding step reads every kept entry of every answering child once. PyTorch's CPU SDPA streams them at about
10 GB/s on the 2-core machines kvbench is developed on (the folded-GQA single-query shape is neither its
bandwidth- nor its compute-optimal case); this kernel (``decode_attention.c``, plain C with an AVX-512 path) streams
them at 25-30 GB/s (``python benchmarks/decode_attention.py``). It is used for every float32 CPU decoding step of
the torch engine, by a child answering alone and by children answering in a batch alike, and its arithmetic per
KV head depends only on that head's query rows and entries: the two paths get bit-identical attention outputs.
Everything else (prefill, question blocks, scoring, other dtypes and devices) stays on SDPA.

The C file is compiled on first use with the machine's C compiler (``$CC``, else ``gcc``, else ``cc``;
``-O3 -march=native``, OpenMP against the libgomp torch itself loaded) into ``$KVBENCH_CACHE/kernels`` (default
``~/.cache/kvbench/kernels``), keyed by the source, the flags, the compiler and the CPU. ``KVBENCH_DECODE_KERNEL=0``
turns it off (SDPA everywhere, today's numerics of earlier releases); without a working compiler it is off too, and
:func:`status` says why (the run manifest records it, and the first use logs a warning naming the fix).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import torch

from kvbench.cache import cache_dir

__all__ = ["DecodeJobs", "applies", "available", "decode_attention", "decode_step", "status"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_attention.c")
FLAGS = ["-O3", "-march=native", "-std=gnu11", "-fPIC", "-shared", "-fopenmp"]
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
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".so.tmp")
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)  # atomic: concurrent builders each write their own file, one wins
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@lru_cache(maxsize=1)
def _load() -> tuple[_Kernel | None, str]:
    if os.environ.get("KVBENCH_DECODE_KERNEL", "1").strip().lower() in ("0", "off", "false", "no"):
        return None, "sdpa (KVBENCH_DECODE_KERNEL=0)"
    cc = _compiler()
    if cc is None:
        return None, "sdpa (no C compiler found: install gcc or set CC to use kvbench's decode-attention kernel)"
    try:
        kernel = _Kernel(_build(cc))
    except (OSError, RuntimeError) as e:
        return None, f"sdpa (kvbench's decode-attention kernel failed to build or load: {e})"
    return kernel, f"kvbench-c ({kernel.path})"


def status() -> str:
    """What float32 CPU decoding steps attend with: ``"kvbench-c (avx512)"``, ``"kvbench-c (generic)"``, or
    ``"sdpa (<why>)"``."""
    return _load()[1]


_warned = False


def available() -> bool:
    """Whether the kernel is built and on (see the module docstring). The first ``False`` logs a warning saying
    why, unless it was turned off on purpose."""
    global _warned
    kernel, why = _load()
    if kernel is None and not _warned and "KVBENCH_DECODE_KERNEL=0" not in why:
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
