"""``triattention``: TriAttention (Mao et al., 2026, arXiv 2604.04921), trigonometric key scoring.

Offline, :func:`calibrate` measures per attention layer and query head the *centre* ``q̄_b`` (complex
mean) and mean magnitude ``E|q_b|`` of the un-rotated queries in every frequency band ``b``. At scoring
time a cached post-RoPE key is scored by the attention logit that the centre query would give it from a
geometric set of future positions, plus a magnitude ("MLR") term, without any query of the context.

Band layout (HF Qwen3-Next / Qwen3.5, ``rotate_half`` convention, partial RoPE): the first ``R``
(``rotary_dim = head_dim * partial_rotary_factor``) dims are rotated, band ``i < R/2`` pairs dims
``(i, i + R/2)`` as ``x_i + j x_{i+R/2}`` with frequency ``ω_i = 1/θ^(2i/R)``; the ``P = head_dim - R``
pass-through dims form ``P/2`` **zero-frequency bands** pairing ``(R + j, R + P/2 + j)`` with ``ω = 0``.
These models rotate 64 of 256 dims (the tiny test models 16 of 64).

Artifacts: ``<name>.safetensors`` (tensors ``q_mean_re``, ``q_mean_im``, ``q_abs_mean`` ``[L, H, B]``
float32 and ``omega`` ``[B]`` float64; the metadata is embedded under the key ``kvbench``) plus a
``<name>.json`` sidecar with the same metadata, including the model fingerprint
(:func:`kvbench.models.fingerprint`). The default location is
``$KVBENCH_CACHE/calibration/triattention/<fingerprint[:16]>.safetensors``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from kvbench.artifacts import (
    META_KEY,
    ReadOnce,
    check_fingerprint,
    find_calibration,
    read_artifact,
    shipped_alternative,
)
from kvbench.atomic import write_atomic
from kvbench.engines.base import ParentSession
from kvbench.errors import KvbenchError
from kvbench.methods import EvictionMethod, register_method
from kvbench.prompt import encode

if TYPE_CHECKING:
    from kvbench.models import LoadedModel

CALIBRATE_COMMAND = "kvbench calibrate triattention --model M --corpus PATH"
FORMAT = "kvbench-triattention-v1"
DEFAULT_MAX_TOKENS = 32768
OFFSET_MAX = 65536

__all__ = [
    "CALIBRATE_COMMAND",
    "TriAttention",
    "TriAttentionStats",
    "band_index",
    "calibrate",
    "default_stats_path",
    "geometric_offsets",
    "load_stats",
    "save_stats",
    "trig_scores",
]


def geometric_offsets(max_offset: int = OFFSET_MAX) -> tuple[int, ...]:
    """``1, 2, 4, …`` up to ``max_offset`` (17 offsets for 65536), TriAttention's future-distance grid."""
    if max_offset < 1:
        raise ValueError("max_offset must be >= 1")
    return tuple(2**i for i in range(int(math.log2(max_offset)) + 1))


def band_index(head_dim: int, rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dims holding the real and imaginary part of each of the ``head_dim / 2`` bands (see module doc)."""
    pass_dim = head_dim - rotary_dim
    if rotary_dim % 2 or pass_dim % 2 or not 0 <= rotary_dim <= head_dim:
        raise KvbenchError(f"cannot split head_dim {head_dim} into rotary dim {rotary_dim} and pass-through bands")
    r2, p2 = rotary_dim // 2, pass_dim // 2
    re = list(range(r2)) + [rotary_dim + j for j in range(p2)]
    im = list(range(r2, rotary_dim)) + [rotary_dim + p2 + j for j in range(p2)]
    return torch.tensor(re, dtype=torch.long), torch.tensor(im, dtype=torch.long)


def trig_scores(
    keys: torch.Tensor,
    q_mean_re: torch.Tensor,
    q_mean_im: torch.Tensor,
    q_abs_mean: torch.Tensor,
    omega: torch.Tensor,
    rotary_dim: int,
    *,
    round_start: int,
    offsets: Sequence[int] = geometric_offsets(),
    aggregation: str = "mean",
    mlr: bool = True,
    zero_freq_bands: bool = True,
    trig: bool = True,
) -> torch.Tensor:
    """TriAttention score of every key for every query head of one layer: ``[H, n]`` float32.

    keys ``[H_kv, n, D]`` post-RoPE (the key at index ``p`` was rotated at position ``p``); q statistics
    ``[H, B]``; omega ``[B]`` (0 for pass-through bands). For query head ``h`` (KV head ``h // G``) and
    key ``p``, with ``Δ = round_start + o - p``::

        s_o(p) = Σ_b |q̄_b||k_b| cos(ω_b Δ + arg(q̄_b conj k_b))  +  Σ_b (E|q_b| - |q̄_b|) |k_b|

    (the first sum only if ``trig``, the second only if ``mlr``; ``k_b`` the un-rotated key band),
    aggregated over the offsets ``o`` by ``mean`` or ``max``. The first sum is the logit
    ``q̄(round_start + o) · k`` of the centre query rotated to the future position, so it is evaluated as
    ``Re(q̄_b e^{jω_b(round_start + o)} conj k_b)`` on the stored (rotated) key, with no RoPE inversion; for
    ``mean`` the offsets fold into one query.
    ``zero_freq_bands=False`` leaves the ``(D - R)/2`` pass-through bands out of both sums (only the
    rotated bands ``b < R/2`` score). ``trig=False`` leaves out the first sum, over every band (the
    reference's ``disable_trig`` ablation): the score is the MLR sum alone, the same for every offset.
    """
    if aggregation not in ("mean", "max"):
        raise ValueError(f"aggregation must be 'mean' or 'max', got {aggregation!r}")
    if not (trig or mlr):
        raise KvbenchError("TriAttention with neither the trigonometric nor the MLR term has nothing to score")
    H_kv, n, D = keys.shape
    H = q_mean_re.shape[0]
    re_idx, im_idx = (i.to(keys.device) for i in band_index(D, rotary_dim))
    if not zero_freq_bands:
        B = rotary_dim // 2
        re_idx, im_idx = re_idx[:B], im_idx[:B]
        q_mean_re, q_mean_im, q_abs_mean, omega = q_mean_re[:, :B], q_mean_im[:, :B], q_abs_mean[:, :B], omega[:B]
    k = keys.float()
    kr, ki = k[..., re_idx], k[..., im_idx]  # [H_kv, n, B]
    dev = keys.device
    qbar = torch.complex(q_mean_re.double(), q_mean_im.double()).to(dev)  # [H, B]
    out = torch.zeros(H_kv, H // H_kv, n, dtype=torch.float32, device=dev)
    if trig:
        out = out + _trig_term(kr, ki, qbar, omega, round_start, offsets, aggregation)
    if mlr:
        spread = (q_abs_mean.double().to(dev) - qbar.abs()).float().view(H_kv, H // H_kv, -1)
        out = out + torch.einsum("kgb,knb->kgn", spread, torch.hypot(kr, ki))
    return out.reshape(H, n)


def _trig_term(
    kr: torch.Tensor,
    ki: torch.Tensor,
    qbar: torch.Tensor,
    omega: torch.Tensor,
    round_start: int,
    offsets: Sequence[int],
    aggregation: str,
) -> torch.Tensor:
    """``[H_kv, G, n]``: the centre-query logit ``Re(q̄_b e^{jω_b(round_start + o)} conj k_b)`` summed over the
    bands ``b`` and aggregated over the offsets ``o`` (kr, ki ``[H_kv, n, B]``; qbar ``[H, B]`` complex128)."""
    H_kv, H, dev = kr.shape[0], qbar.shape[0], kr.device
    pos = round_start + torch.tensor(list(offsets), dtype=torch.float64, device=dev)  # [O]
    angle = pos[:, None] * omega.double().to(dev)[None]  # [O, B]
    rot = torch.polar(torch.ones_like(angle), angle)
    if aggregation == "mean":
        c = (qbar * rot.mean(0)[None]).view(H_kv, H // H_kv, -1)  # [H_kv, G, B]
        return torch.einsum("kgb,knb->kgn", c.real.float(), kr) + torch.einsum("kgb,knb->kgn", c.imag.float(), ki)
    c = (qbar[:, None, :] * rot[None]).view(H_kv, H // H_kv, len(pos), -1)  # [H_kv, G, O, B]
    per_offset = torch.einsum("kgob,knb->kgon", c.real.float(), kr) + torch.einsum("kgob,knb->kgon", c.imag.float(), ki)
    return per_offset.amax(dim=2)


# ----------------------------------------------------------------------------------------------------
# Statistics artifact
# ----------------------------------------------------------------------------------------------------


@dataclass
class TriAttentionStats:
    """Calibrated query statistics of one model.

    q_mean_re / q_mean_im: real and imaginary part of the band centre ``q̄`` ``[L_attn, H, B]``;
    q_abs_mean: ``E|q_b|`` ``[L_attn, H, B]``; omega: band frequency ``[B]`` (0 for pass-through bands);
    metadata: ``fingerprint``, ``head_dim``, ``rotary_dim``, ``rope_theta``, ``n_tokens``, … (json-able).
    The :attr:`sha256` of statistics is that of the file :func:`save_stats` writes for them (for statistics
    read from a file, that file's).
    """

    q_mean_re: torch.Tensor
    q_mean_im: torch.Tensor
    q_abs_mean: torch.Tensor
    omega: torch.Tensor
    metadata: dict = field(default_factory=dict)
    file_sha256: str | None = field(default=None, repr=False, compare=False)

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the artifact file: the one read, else the bytes :func:`save_stats` would write."""
        return self.file_sha256 or hashlib.sha256(_serialize(self)).hexdigest()

    @property
    def fingerprint(self) -> str:
        return str(self.metadata.get("fingerprint", ""))

    @property
    def rotary_dim(self) -> int:
        return int(self.metadata["rotary_dim"])

    @property
    def head_dim(self) -> int:
        return int(self.metadata["head_dim"])

    def save_stats(self, path: str | os.PathLike) -> Path:
        """Write ``path`` (safetensors, metadata embedded) and its ``.json`` sidecar; returns ``path``."""
        return save_stats(self, path)


def default_stats_path(fingerprint: str) -> Path:
    """``$KVBENCH_CACHE/calibration/triattention/<fingerprint[:16]>.safetensors``."""
    from kvbench.models import cache_dir

    return cache_dir() / "calibration" / "triattention" / f"{fingerprint[:16]}.safetensors"


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def _metadata(stats: TriAttentionStats) -> dict:
    """The artifact's metadata: ``format`` and the statistics' own (embedded in the file and its sidecar)."""
    return {"format": FORMAT, **stats.metadata}


def _serialize(stats: TriAttentionStats) -> bytes:
    """The artifact file's bytes: safetensors of the four tensors, :func:`_metadata` embedded."""
    from safetensors.torch import save

    meta = _metadata(stats)
    tensors = {
        "q_mean_re": stats.q_mean_re.detach().float().cpu().contiguous(),
        "q_mean_im": stats.q_mean_im.detach().float().cpu().contiguous(),
        "q_abs_mean": stats.q_abs_mean.detach().float().cpu().contiguous(),
        "omega": stats.omega.detach().double().cpu().contiguous(),
    }
    return save(tensors, metadata={META_KEY: json.dumps(meta, sort_keys=True)})


def save_stats(stats: TriAttentionStats, path: str | os.PathLike) -> Path:
    """Atomically write the statistics to ``path`` and the metadata to ``path`` with suffix ``.json``."""
    path = Path(path)
    data, meta = _serialize(stats), _metadata(stats)
    write_atomic(path, data)
    write_atomic(_sidecar(path), json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return path


def load_stats(path: str | os.PathLike, expected_fingerprint: str | None) -> TriAttentionStats:
    """Load statistics written by :func:`save_stats`.

    A missing file, a file that is not a kvbench TriAttention artifact, or (unless
    ``expected_fingerprint`` is None) statistics of another model is a :class:`KvbenchError` naming the
    calibrate command.
    """
    path = Path(path)
    what = "TriAttention calibration statistics"
    artifact = read_artifact(path, what=what, fmt=FORMAT, fix=CALIBRATE_COMMAND)
    meta, tensors = artifact.meta, artifact.tensors
    check_fingerprint(
        str(meta.get("fingerprint", "")), expected_fingerprint, what=f"{what} at {path}", fix=CALIBRATE_COMMAND
    )
    names = ("q_mean_re", "q_mean_im", "q_abs_mean", "omega")
    if set(tensors) != set(names):
        raise KvbenchError(
            f"{path} holds tensors {sorted(tensors)}, expected {list(names)}; recreate it with `{CALIBRATE_COMMAND}`"
        )
    return TriAttentionStats(metadata=meta, file_sha256=artifact.sha256, **tensors)


# ----------------------------------------------------------------------------------------------------
# Calibration
# ----------------------------------------------------------------------------------------------------


def rope_layout(model: torch.nn.Module, head_dim: int) -> tuple[int, torch.Tensor, dict]:
    """``(rotary_dim, inv_freq [rotary_dim/2] float64, info)`` from ``model.config.rope_parameters``.

    Only the ``default`` RoPE type (no frequency scaling, attention scaling 1) is supported. Where the
    model has a rotary embedding module, its ``inv_freq`` buffer (the frequencies the model actually
    applies, e.g. bf16-rounded after ``model.to(bfloat16)``) is used, after checking that it agrees with
    the config to 1%; otherwise the config's frequencies (float32 arithmetic, as transformers computes them).
    """
    tc = model.config.get_text_config()
    params = dict(getattr(tc, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise KvbenchError(f"TriAttention supports the default RoPE only; this model uses rope_type {rope_type!r}")
    theta = params.get("rope_theta", getattr(tc, "rope_theta", None))
    if theta is None:
        raise KvbenchError("the model config has no rope_theta; TriAttention cannot place its frequency bands")
    factor = float(params.get("partial_rotary_factor", getattr(tc, "partial_rotary_factor", 1.0)))
    rotary_dim = int(head_dim * factor)
    inv_freq = 1.0 / (float(theta) ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    for module in model.modules():
        buf = getattr(module, "inv_freq", None)
        if isinstance(buf, torch.Tensor) and type(module).__name__.endswith("RotaryEmbedding"):
            applied = buf.detach().float().cpu()
            if applied.shape != inv_freq.shape or not torch.allclose(applied, inv_freq, rtol=1e-2, atol=0):
                raise KvbenchError(
                    f"{type(module).__name__}.inv_freq does not match rope_theta={theta}, partial_rotary_factor="
                    f"{factor}, head_dim={head_dim}; TriAttention cannot place its frequency bands"
                )
            scaling = float(getattr(module, "attention_scaling", 1.0))
            if scaling != 1.0:
                raise KvbenchError(f"TriAttention supports RoPE attention scaling 1 only, got {scaling}")
            inv_freq = applied
            break
    info = {"rope_theta": float(theta), "partial_rotary_factor": factor, "rope_type": rope_type}
    return rotary_dim, inv_freq.double(), info


def _token_ids(tokenizer, doc) -> list[int]:
    if isinstance(doc, str):
        if tokenizer is None:
            raise KvbenchError("calibration texts need a tokenizer")
        return encode(tokenizer, doc)
    return [int(t) for t in doc]


@torch.no_grad()
def calibrate(
    model: torch.nn.Module,
    tokenizer,
    corpus_texts: Iterable[str | Sequence[int]],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_len: int | None = None,
    fingerprint: str | None = None,
) -> TriAttentionStats:
    """Per attention layer and query head: band centre and mean band magnitude of the un-rotated queries.

    corpus_texts: strings (tokenised without special tokens) or token-id sequences; each is prefilled on
    its own from position 0 (cut to ``max_len``, default the model limit; ``kvbench calibrate`` passes the
    model's trained length), in order, until ``max_tokens`` tokens have been used in total (``kvbench
    calibrate`` orders a corpus round-robin over its kinds, :func:`kvbench.corpus.round_robin`, so that every
    kind is used). The queries are the ones the attention actually uses (q/gate split,
    q_norm, partial RoPE), read from the engine's prefill; RoPE is undone per position in float64 and the
    sums are accumulated in float64. fingerprint: the model's :func:`kvbench.models.fingerprint`
    (computed from ``model`` and ``tokenizer`` when not given).
    """
    from kvbench.engines.torch_engine import TorchEngine

    if max_tokens < 1:
        raise KvbenchError(f"max_tokens must be positive, got {max_tokens}")
    engine = TorchEngine(model)
    D, H, L = engine.head_dim, engine.n_heads, len(engine.adapter.attn)
    rotary_dim, inv_freq, rope_info = rope_layout(model, D)
    re_idx, im_idx = band_index(D, rotary_dim)
    B = D // 2
    omega = torch.zeros(B, dtype=torch.float64)
    omega[: rotary_dim // 2] = inv_freq
    dev = engine.device
    s_re = torch.zeros(L, H, B, dtype=torch.float64, device=dev)
    s_im = torch.zeros_like(s_re)
    s_abs = torch.zeros_like(s_re)
    limit = min(max_len or engine.max_context, engine.max_context)
    used = docs = 0
    for doc in corpus_texts:
        ids = _token_ids(tokenizer, doc)[: min(limit, max_tokens - used)]
        if not ids:
            continue
        n = len(ids)
        parent = engine.prefill(ids, prot=0, query_window=n)
        try:
            angle = torch.arange(n, dtype=torch.float64, device=dev)[:, None] * omega.to(dev)[None]  # [n, B]
            cos, sin = torch.cos(angle).float(), torch.sin(angle).float()
            for f in range(L):
                q = parent.queries(f, range(n)).float()  # [H, n, D]
                qr, qi = q[..., re_idx.to(dev)], q[..., im_idx.to(dev)]
                ur = qr * cos + qi * sin  # (qr + j qi) e^{-jωt}
                ui = qi * cos - qr * sin
                s_re[f] += ur.sum(1, dtype=torch.float64)
                s_im[f] += ui.sum(1, dtype=torch.float64)
                s_abs[f] += torch.hypot(ur, ui).sum(1, dtype=torch.float64)
        finally:
            parent.release()
        used += n
        docs += 1
        if used >= max_tokens:
            break
    if used == 0:
        raise KvbenchError("the TriAttention calibration corpus is empty (no tokens)")
    if fingerprint is None:
        from kvbench.models import fingerprint as model_fingerprint

        fingerprint = model_fingerprint(model, tokenizer)
    tc = model.config.get_text_config()
    metadata = {
        "fingerprint": fingerprint,
        "model_type": str(getattr(model.config, "model_type", "")),
        "attn_layer_ids": list(engine.adapter.attn_layer_ids),
        "n_attn_layers": L,
        "n_heads": H,
        "n_kv_heads": engine.n_kv_heads,
        "head_dim": D,
        "rotary_dim": rotary_dim,
        "band_layout": "half: rotated (i, i+R/2), pass-through (R+j, R+P/2+j) at omega 0",
        "n_tokens": used,
        "n_documents": docs,
        "max_tokens": max_tokens,
        "max_len": limit,
        "hidden_size": int(getattr(tc, "hidden_size", 0)),
        **rope_info,
    }
    return TriAttentionStats(
        q_mean_re=(s_re / used).float().cpu(),
        q_mean_im=(s_im / used).float().cpu(),
        q_abs_mean=(s_abs / used).float().cpu(),
        omega=omega,
        metadata=metadata,
    )


# ----------------------------------------------------------------------------------------------------
# The method
# ----------------------------------------------------------------------------------------------------


@register_method
class TriAttention(EvictionMethod):
    """TriAttention: trigonometric scoring of post-RoPE keys from offline query statistics.

    Per attention layer ``f`` and query head ``h``, every context key ``p`` is scored by
    :func:`trig_scores` with ``round_start = n`` (the position of the first question token), offsets
    ``o ∈ {1, 2, 4, …, 65536}`` and the ``mean`` over offsets, plus the MLR term. Scores are z-scored per
    query head over the body candidates (positions ``prot..n-1``), then the **max over the query heads
    of each KV head** (GQA-group max) gives the ``[H_kv, n]`` scores; flat per-head budgets. Knobs (class
    or instance attributes): ``offsets``, ``aggregation`` (``"mean"`` or ``"max"``), ``normalize``
    (z-score), ``mlr`` (magnitude term), ``zero_freq_bands``, ``trig`` (trigonometric term). ``zero_freq_bands``,
    ``mlr``, ``normalize`` and ``trig`` are method options (``kvbench run --set triattention.trig=false``);
    ``trig=false`` is the reference's ``disable_trig`` ablation (the MLR term alone), ``mlr=false`` drops the
    MLR term (the reference's ``disable_mlr`` instead replaces its weight ``E|q| - |q̄|`` by ``E|q|``).

    Pass-through dims (``zero_freq_bands``, default True, the paper's stated setting): the ``D - R`` dims that
    RoPE does not rotate enter as zero-frequency bands, whose trig term is the position-independent
    ``q̄·k`` of those dims. With partial RoPE that is most of the head (48 of 64 dims on ``tiny-trained``,
    192 of 256 on Qwen3-Next). On ``tiny-trained`` that constant term favours keys like the mean key and buries
    the needle, whose signal there is in the magnitude term over the same dims (docs/triattention.md, measured
    with scripts/triattention_diagnose.py). ``zero_freq_bands=False`` scores the rotated bands only (both sums),
    to show that choice's effect; it is not the paper's method.

    Statistics: ``stats`` (constructor argument: a :class:`TriAttentionStats` in memory, e.g. straight
    from :func:`calibrate`) is used as is; else ``stats_path`` (class or instance attribute, or
    constructor argument) names the artifact; otherwise it is :func:`default_stats_path` of the model
    fingerprint. The fingerprint is ``fingerprint`` (class or instance attribute, or constructor
    argument) or, when unset, the parent's ``model_fingerprint`` (the engine's model). A missing
    artifact, or statistics calibrated for another fingerprint, is a :class:`KvbenchError` naming
    ``kvbench calibrate triattention``. When the fingerprint is unknown (parent without model/tokenizer
    and no ``fingerprint``) it cannot be checked; layer count, head count and head dim always are.

    Differences from the reference implementation (WeianMao/triattention):

    * protocol: the reference compresses while decoding (every 128 steps, budget 2048, prefill
      protected, ``round_start`` = current position); here one scoring pass at the end of the context
      (``round_start = n``, ``allow_prefill_compression``), the protected prefix kept by the harness.
    * partial RoPE: the reference pairs all ``D/2`` dims ``(i, i + D/2)`` as rotated bands; here only the
      ``R/2`` rotated pairs ``(i, i + R/2)`` carry a frequency and the ``(D - R)/2`` pass-through pairs
      ``(R + j, R + (D-R)/2 + j)`` are zero-frequency bands (their trig term is the constant
      ``q̄·k`` of those dims, their MLR term uses this pairing).
    * calibration: the reference re-projects ``q_proj`` outputs as ``[H, D]`` (wrong for the gated
      ``q_proj`` of these models) without ``q_norm`` and recomputes RoPE; here the engine's recorded
      queries (q/gate split, q_norm, partial RoPE) are un-rotated. Several documents may be used, each
      from position 0, up to ``max_tokens`` (default 32,768, the paper's calibration size) in total.
    * scoring evaluates ``Re(q̄ e^{jω(n+o)} conj k)`` on the stored rotated key (equal to the
      reference's RoPE inversion followed by ``|q̄||k| cos(ωΔ + φ)``), folding the offset mean into one
      query per head.
    * selection: per (layer, KV head) with GQA max (the reference's ``per_layer_perhead_pruning`` with
      ``layer_perhead_aggregation="max"``; its CLI default ``per_head_pruning`` shares one kept set per KV
      head across all layers); z-score normalisation as the reference's default ``normalize_scores``; no
      1e-6 random tie-break noise (scores are deterministic).
    * only the default RoPE type (attention scaling 1) is supported.
    """

    name = "triattention"
    default_allocation = "flat"
    stats_path: str | os.PathLike | None = None
    offsets: tuple[int, ...] = geometric_offsets(OFFSET_MAX)
    aggregation = "mean"
    normalize = True
    mlr = True
    zero_freq_bands = True
    trig = True
    calibration = ""
    options = {
        "calibration": "a shipped alternative calibration of the built-in models instead of the default one "
        "(docs/methods.md#calibration-corpora names them)",
        "zero_freq_bands": "score the pass-through (un-rotated) dims as zero-frequency bands (the paper's "
        "setting); false scores the rotated bands only",
        "mlr": "add the magnitude (MLR) term",
        "normalize": "z-score each query head's scores before the GQA max",
        "trig": "add the trigonometric (centre-query) term; false scores the MLR term alone (the reference's "
        "disable_trig ablation)",
    }

    def __init__(
        self,
        seed: int = 0,
        stats_path: str | os.PathLike | None = None,
        fingerprint: str | None = None,
        stats: TriAttentionStats | None = None,
    ):
        super().__init__(seed)
        if stats_path is not None:
            self.stats_path = stats_path
        if fingerprint is not None:
            self.fingerprint = fingerprint
        self.stats = stats
        self._cache: ReadOnce[TriAttentionStats] = ReadOnce(load_stats)

    @classmethod
    def calibrate(
        cls, lm: LoadedModel, texts: list[str], *, max_tokens: int = DEFAULT_MAX_TOKENS, out: Path | None = None
    ) -> Path:
        """Offline calibration (``kvbench calibrate triattention``): :func:`calibrate` on ``texts`` (each cut to
        the model's trained ``context_length``, at most ``max_tokens`` tokens in all) for ``lm``, saved to
        ``out`` (default :func:`default_stats_path` of its fingerprint). Returns the artifact's path; its
        ``.json`` sidecar holds the metadata (``n_tokens``, ``n_documents``, ``max_len``, …)."""
        stats = calibrate(
            lm.model, lm.tokenizer, texts, max_tokens=max_tokens, max_len=lm.context_length, fingerprint=lm.fingerprint
        )
        return stats.save_stats(out or default_stats_path(lm.fingerprint))

    @classmethod
    def prepare_offline(cls, model: torch.nn.Module, tokenizer, workdir: Path, *, seed: int = 0) -> TriAttention:
        """Statistics calibrated in memory (:func:`calibrate`, nothing written) on two synthetic documents of
        300 letters each: an instance for offline checks on a small model."""
        texts = ["".join(chr(97 + (i * 7 + j) % 26) for j in range(300)) for i in range(2)]
        return cls(seed=seed, stats=calibrate(model, tokenizer, texts))

    @classmethod
    def describe_calibration(cls, path: Path) -> str:
        """The documents and tokens the statistics at ``path`` came from, and the length each was cut to (from
        the ``.json`` sidecar)."""
        meta = json.loads(_sidecar(Path(path)).read_text())
        return f"{meta['n_documents']} documents, {meta['n_tokens']:,} tokens (each cut to {meta['max_len']:,})"

    def set_options(self, values: Mapping[str, str]) -> None:
        """As :meth:`EvictionMethod.set_options`; ``trig=false`` with ``mlr=false`` (no term left) is refused."""
        super().set_options(values)
        if not (self.trig or self.mlr):
            raise KvbenchError(
                "--set triattention.trig=false with triattention.mlr=false leaves nothing to score; keep one of them"
            )

    def resolve_stats_path(self, parent: ParentSession | None = None) -> Path:
        """``stats_path`` if set, else the default location for the model's fingerprint."""
        return self._stats_path(self.model_fingerprint(parent))

    def _stats_path(self, fingerprint: str | None) -> Path:
        if self.stats_path is not None:
            return Path(self.stats_path)
        if self.calibration and fingerprint:
            return shipped_alternative(self.calibration, default_stats_path(fingerprint))
        if fingerprint:
            return find_calibration(default_stats_path(fingerprint))
        raise KvbenchError(
            "TriAttention cannot locate its calibration statistics: `stats_path` is not set and the model "
            f"fingerprint is unknown (set `fingerprint` on the method); calibrate with `{CALIBRATE_COMMAND}`"
        )

    def _stats(self, fingerprint: str | None) -> TriAttentionStats:
        """``stats`` if given, else the artifact for that fingerprint, read once per path and fingerprint; the
        fingerprint is checked whenever it is known."""
        if self.stats is not None:
            check_fingerprint(
                self.stats.fingerprint, fingerprint, what="TriAttention statistics given in memory",
                fix=CALIBRATE_COMMAND,
            )  # fmt: skip
            return self.stats
        path = self._stats_path(fingerprint)
        return self._cache.get(path, fingerprint)

    def artifact_sha256(self, model_fingerprint: str | None) -> str | None:
        """The SHA-256 of the statistics file this instance scores that model with (read here, once); for
        statistics given in memory, of the file :func:`save_stats` would write for them."""
        return self._stats(self.fingerprint or model_fingerprint).sha256

    def load(self, parent: ParentSession | None = None) -> TriAttentionStats:
        """The statistics for ``parent``'s model: ``stats`` if given, else the artifact (read once per path
        and fingerprint). The fingerprint is checked whenever it is known."""
        return self._stats(self.model_fingerprint(parent))

    def _check(self, stats: TriAttentionStats, parent: ParentSession) -> None:
        where = "(in memory)" if self.stats is not None else str(self.resolve_stats_path(parent))
        want = (parent.n_attn_layers, parent.n_heads, parent.head_dim // 2)
        got = tuple(stats.q_mean_re.shape)
        if got != want or stats.head_dim != parent.head_dim:
            raise KvbenchError(
                f"TriAttention statistics {where} have [layers, heads, bands] "
                f"{list(got)} and head_dim {stats.head_dim}, the model {list(want)} and {parent.head_dim}; "
                f"recalibrate with `{CALIBRATE_COMMAND}`"
            )

    def head_scores(self, parent: ParentSession, stats: TriAttentionStats, f: int) -> torch.Tensor:
        """Raw scores ``[H, n]`` of every key of attention layer ``f`` for every query head: :func:`trig_scores`
        with this instance's settings and ``round_start = parent.n`` (before z-score and GQA max)."""
        return trig_scores(
            parent.keys(f),
            stats.q_mean_re[f],
            stats.q_mean_im[f],
            stats.q_abs_mean[f],
            stats.omega,
            stats.rotary_dim,
            round_start=parent.n,
            offsets=self.offsets,
            aggregation=self.aggregation,
            mlr=self.mlr,
            zero_freq_bands=self.zero_freq_bands,
            trig=self.trig,
        )

    def score(self, parent: ParentSession) -> list[torch.Tensor]:
        stats = self.load(parent)
        self._check(stats, parent)
        n, H_kv, H = parent.n, parent.n_kv_heads, parent.n_heads
        out = []
        for f in range(parent.n_attn_layers):
            s = self.head_scores(parent, stats, f)  # [H, n]
            if self.normalize:
                s = zscore(s, parent.prot)
            out.append(s.view(H_kv, H // H_kv, n).amax(dim=1))
        return out


def zscore(scores: torch.Tensor, prot: int) -> torch.Tensor:
    """Standardise each row by the mean and (population) std of its body ``[prot:]`` (std >= 1e-6)."""
    body = scores[:, prot:] if scores.shape[1] - prot >= 2 else scores
    mean = body.mean(dim=1, keepdim=True)
    std = body.std(dim=1, unbiased=False, keepdim=True).clamp_min(1e-6)
    return (scores - mean) / std
