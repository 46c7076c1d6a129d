"""The GateSight estimator (paper §4.1, Appendix G) and its artifact.

One MLP ``inputs -> hidden -> 1`` (ReLU hidden layer, sigmoid output) per (attention layer, KV head).
The MLPs of one layer read the same standardised features, so they are stored batched (``w1[f]``
``[H_kv, d_f, hidden]`` …) and evaluated as one matrix product ``[n, d_f] x [d_f, H_kv * hidden]`` plus a
batched reduction: scoring is linear in ``n`` with no Python loop over tokens (rows are processed in
chunks of ``CHUNK`` to bound memory).

Artifact (a directory)::

    estimator.safetensors   layer{f}.w1 [H_kv, d_f, hidden]  layer{f}.b1 [H_kv, hidden]
                            layer{f}.w2 [H_kv, hidden]       layer{f}.b2 [H_kv]
                            layer{f}.feat_mean [d_f]         layer{f}.feat_std [d_f]
                            gate_means [L_attn] (float64)    -- metadata "kvbench": the json below
    gatesight.json          format, fingerprint, model_type, attn_layer_ids, gdn_layer_ids, n_kv_heads,
                            n_heads, n_value_heads, window, windows (GDN ordinals per layer), in_dims,
                            hidden, activation, feature_order, gate_means, training (config, data, loss)

The default location is ``$KVBENCH_CACHE/calibration/gatesight/<fingerprint[:16]>/``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from kvbench.artifacts import META_KEY, check_fingerprint, read_artifact
from kvbench.atomic import write_dir
from kvbench.errors import KvbenchError

from .features import feature_dims, layer_features

FORMAT = "kvbench-gatesight-v1"
WEIGHTS_FILE = "estimator.safetensors"
META_FILE = "gatesight.json"
ARTIFACT_ENV = "KVBENCH_GATESIGHT_ARTIFACT"
PRODUCE_COMMAND = (
    "kvbench gatesight label --model M --corpus PATH --out LABELS && kvbench gatesight train --labels LABELS"
)
CHUNK = 65536

__all__ = [
    "ARTIFACT_ENV",
    "FORMAT",
    "GateSightEstimator",
    "PRODUCE_COMMAND",
    "default_artifact_dir",
    "load_artifact",
    "save_artifact",
]


def default_artifact_dir(fingerprint: str) -> Path:
    """``$KVBENCH_CACHE/calibration/gatesight/<fingerprint[:16]>/``."""
    from kvbench.models import cache_dir

    return cache_dir() / "calibration" / "gatesight" / fingerprint[:16]


class GateSightEstimator(nn.Module):
    """Per (attention layer, KV head) MLPs with stored feature statistics.

    windows: per attention layer ordinal, the GDN ordinals it reads; n_value_heads: GDN value heads ``Hv``;
    metadata: the artifact's json (model identity, window, gate means, training record); sha256: the hex
    SHA-256 of the weights file it was loaded from (None for one built in memory).
    """

    sha256: str | None = None

    def __init__(
        self,
        windows: Sequence[Sequence[int]],
        n_kv_heads: int,
        n_value_heads: int,
        hidden: int = 64,
        metadata: dict | None = None,
    ) -> None:
        super().__init__()
        self.windows = [list(w) for w in windows]
        self.n_kv_heads = int(n_kv_heads)
        self.n_value_heads = int(n_value_heads)
        self.hidden = int(hidden)
        self.in_dims = feature_dims(self.windows, self.n_value_heads)
        self.metadata = dict(metadata or {})
        H, k = self.n_kv_heads, self.hidden
        self.w1 = nn.ParameterList([nn.Parameter(torch.empty(H, d, k)) for d in self.in_dims])
        self.b1 = nn.ParameterList([nn.Parameter(torch.empty(H, k)) for _ in self.in_dims])
        self.w2 = nn.ParameterList([nn.Parameter(torch.empty(H, k)) for _ in self.in_dims])
        self.b2 = nn.ParameterList([nn.Parameter(torch.empty(H)) for _ in self.in_dims])
        for f, d in enumerate(self.in_dims):
            self.register_buffer(f"feat_mean_{f}", torch.zeros(d))
            self.register_buffer(f"feat_std_{f}", torch.ones(d))
        self.register_buffer("gate_means", torch.ones(len(self.in_dims), dtype=torch.float64))
        self.reset_parameters()

    @property
    def n_layers(self) -> int:
        return len(self.in_dims)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """``nn.Linear``'s default init (uniform in ``±1/sqrt(fan_in)``), drawn from ``generator``."""
        with torch.no_grad():
            for f, d in enumerate(self.in_dims):
                k = self.hidden
                for p, fan_in in ((self.w1[f], d), (self.b1[f], d), (self.w2[f], k), (self.b2[f], k)):
                    bound = 1.0 / math.sqrt(fan_in)
                    p.copy_(torch.rand(p.shape, generator=generator) * 2 * bound - bound)

    def feature_stats(self, f: int) -> tuple[torch.Tensor, torch.Tensor]:
        return getattr(self, f"feat_mean_{f}"), getattr(self, f"feat_std_{f}")

    def set_feature_stats(self, f: int, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Standardisation of layer ``f``; stds below 1e-6 (constant features) become 1."""
        std = torch.where(std < 1e-6, torch.ones_like(std), std)
        getattr(self, f"feat_mean_{f}").copy_(mean)
        getattr(self, f"feat_std_{f}").copy_(std)

    def standardise(self, f: int, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.feature_stats(f)
        return (x - mean) / std

    def layer_logits(self, f: int, x: torch.Tensor, *, standardised: bool = False) -> torch.Tensor:
        """Logits ``[H_kv, P]`` of layer ``f``'s MLPs for raw (or already standardised) features ``[P, d_f]``."""
        if x.shape[-1] != self.in_dims[f]:
            raise KvbenchError(f"layer {f} expects {self.in_dims[f]} features, got {x.shape[-1]}")
        outs = []
        H, k = self.n_kv_heads, self.hidden
        w1 = self.w1[f].permute(1, 0, 2).reshape(self.in_dims[f], H * k)
        for start in range(0, x.shape[0], CHUNK):
            xs = x[start : start + CHUNK]
            if not standardised:
                xs = self.standardise(f, xs)
            h = torch.relu((xs @ w1).view(-1, H, k) + self.b1[f])  # [P, H, k]
            outs.append(torch.einsum("phk,hk->hp", h, self.w2[f]) + self.b2[f][:, None])
        if not outs:
            return x.new_zeros(H, 0)
        return torch.cat(outs, dim=1)

    @torch.no_grad()
    def score_signals(self, beta, g, vnorm, n: int | None = None) -> list[torch.Tensor]:
        """Per attention layer, logits ``[H_kv, n]`` (monotone in the predicted utility ``sigmoid(logit)``)."""
        out = []
        for f, window in enumerate(self.windows):
            x = layer_features(beta, g, vnorm, window, n)
            out.append(self.layer_logits(f, x))
        return out

    @torch.no_grad()
    def predict(self, beta, g, vnorm, n: int | None = None) -> list[torch.Tensor]:
        """Predicted utility in [0, 1], per attention layer ``[H_kv, n]``."""
        return [torch.sigmoid(s) for s in self.score_signals(beta, g, vnorm, n)]

    @property
    def fingerprint(self) -> str:
        return str(self.metadata.get("fingerprint", ""))


def _tensors(est: GateSightEstimator) -> dict[str, torch.Tensor]:
    t = {}
    for f in range(est.n_layers):
        mean, std = est.feature_stats(f)
        t[f"layer{f}.w1"] = est.w1[f]
        t[f"layer{f}.b1"] = est.b1[f]
        t[f"layer{f}.w2"] = est.w2[f]
        t[f"layer{f}.b2"] = est.b2[f]
        t[f"layer{f}.feat_mean"] = mean
        t[f"layer{f}.feat_std"] = std
    t["gate_means"] = est.gate_means
    return {k: v.detach().cpu().contiguous() for k, v in t.items()}


def save_artifact(est: GateSightEstimator, path: str | os.PathLike) -> Path:
    """Write the artifact directory ``path`` (weights + json) atomically; returns ``path``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        **est.metadata,
        "format": FORMAT,
        "windows": est.windows,
        "window": int(est.metadata.get("window", max((len(w) for w in est.windows), default=0))),
        "in_dims": est.in_dims,
        "n_kv_heads": est.n_kv_heads,
        "n_value_heads": est.n_value_heads,
        "hidden": est.hidden,
        "activation": "relu",
        "output": "sigmoid",
        "feature_order": "per window GDN layer (ascending), per value head, (beta, g, |v|); then i/n, (n-i)/n, "
        "log(1+n-i)/log(1+n) with i = position + 1",
        "gate_means": [float(x) for x in est.gate_means.tolist()],
    }

    def write(tmp: Path) -> None:
        save_file(_tensors(est), str(tmp / WEIGHTS_FILE), metadata={META_KEY: json.dumps(meta, sort_keys=True)})
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")

    write_dir(path, write)
    est.metadata = meta
    return path


def load_artifact(path: str | os.PathLike, expected_fingerprint: str | None = None) -> GateSightEstimator:
    """Load an artifact written by :func:`save_artifact`.

    Absence, a foreign or damaged file, or (unless ``expected_fingerprint`` is None) an artifact trained for
    another model is a :class:`KvbenchError` naming the commands that produce one.
    """
    path = Path(path)
    weights = path / WEIGHTS_FILE if path.is_dir() else path
    if not weights.is_file():
        raise KvbenchError(
            f"no GateSight artifact at {path}; produce one for this model with `{PRODUCE_COMMAND}` "
            f"(or point ${ARTIFACT_ENV} at an existing artifact directory)"
        )
    artifact = read_artifact(weights, what="GateSight artifact", fmt=FORMAT, fix=PRODUCE_COMMAND)
    meta, tensors = artifact.meta, artifact.tensors
    check_fingerprint(
        str(meta.get("fingerprint", "")),
        expected_fingerprint,
        what=f"GateSight artifact at {path}",
        fix=PRODUCE_COMMAND,
    )
    try:
        est = GateSightEstimator(meta["windows"], meta["n_kv_heads"], meta["n_value_heads"], meta["hidden"], meta)
        state = {}
        for f in range(est.n_layers):
            for name in ("w1", "b1", "w2", "b2"):
                state[f"{name}.{f}"] = tensors[f"layer{f}.{name}"]
            state[f"feat_mean_{f}"] = tensors[f"layer{f}.feat_mean"]
            state[f"feat_std_{f}"] = tensors[f"layer{f}.feat_std"]
        state["gate_means"] = tensors["gate_means"]
        est.load_state_dict(state, strict=True)
        est.sha256 = artifact.sha256
    except (KeyError, RuntimeError, TypeError) as exc:
        raise KvbenchError(
            f"{weights} is inconsistent ({type(exc).__name__}: {exc}); recreate it with `{PRODUCE_COMMAND}`"
        ) from None
    return est.eval()
