"""Training the estimator (paper §4.1, Appendix G) and the ridge baseline, from a label directory.

Recipe: binary cross-entropy between ``sigmoid(logit)`` and the label max-normalised per (document, layer,
KV head) over the body ``prot..n-1`` (the protected chat prefix is excluded from normalisation, sampling and
evaluation, as the paper's Appendix H does); AdamW (lr 2e-3, weight decay 1e-2), gradient clipping 1.0
**per MLP** (the 64 MLPs are independent models; their losses are summed, so each gets exactly its own
gradient), 12 epochs, 500 random body positions per document (drawn once, seed 0), seed 0.

The sampled positions' signals are held in memory as ``[N, L_gdn, Hv, 3]`` float32 (``N`` = documents x
positions; 33 GB at the paper's 2,428 x 500 positions of Qwen3.5-27B); each layer's features are assembled per
batch from its window, never for all rows at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import torch

from kvbench.errors import KvbenchError

from .estimator import GateSightEstimator
from .features import age_features, window_ordinals
from .labels import LabelledDoc, LabelSet

__all__ = [
    "TrainConfig",
    "TrainingData",
    "build_training_data",
    "fit_ridge",
    "fit_ridge_chunks",
    "fit_ridge_layer",
    "gate_means_from_labels",
    "normalised_utility",
    "train_estimator",
    "train_from_labels",
]


@dataclass
class TrainConfig:
    """Estimator training recipe (Appendix G defaults; ``batch_size`` is not given by the paper)."""

    window: int = 6
    hidden: int = 64
    lr: float = 2e-3
    weight_decay: float = 1e-2
    grad_clip: float = 1.0
    epochs: int = 12
    positions_per_doc: int = 500
    batch_size: int = 256
    seed: int = 0
    age_only: bool = False  # control of Table 5: the three age features alone

    def to_json(self) -> dict:
        return asdict(self)


def normalised_utility(utility: torch.Tensor, prot: int) -> torch.Tensor:
    """``U / max_{i >= prot} U`` per (layer, KV head): ``[L, H_kv, n]`` in [0, 1] on the body (0 where the max is 0)."""
    body = utility[..., prot:] if utility.shape[-1] > prot else utility
    peak = body.amax(dim=-1, keepdim=True)
    return torch.where(peak > 0, utility / peak.clamp_min(torch.finfo(utility.dtype).tiny), torch.zeros_like(utility))


@dataclass
class TrainingData:
    """Sampled body positions of the training documents.

    signals ``[N, L_gdn, Hv, 3]`` (beta, g, |v|); age ``[N, 3]``; target ``[N, L_attn, H_kv]`` normalised labels;
    doc ``[N]`` index into ``docs``.
    """

    signals: torch.Tensor
    age: torch.Tensor
    target: torch.Tensor
    doc: torch.Tensor
    docs: list[LabelledDoc]

    def __len__(self) -> int:
        return self.signals.shape[0]

    def layer_features(self, window: Sequence[int], rows: torch.Tensor | slice | None = None) -> torch.Tensor:
        s = self.signals if rows is None else self.signals[rows]
        a = self.age if rows is None else self.age[rows]
        return torch.cat([s[:, list(window)].flatten(1), a], dim=1)


def doc_positions(doc: LabelledDoc, count: int, generator: torch.Generator) -> torch.Tensor:
    """Up to ``count`` distinct random body positions (sorted) of ``doc``."""
    body = doc.n - doc.prot
    if body <= 0:
        return torch.zeros(0, dtype=torch.long)
    if count >= body:
        return torch.arange(doc.prot, doc.n)
    return torch.sort(torch.randperm(body, generator=generator)[:count] + doc.prot).values


def build_training_data(docs: Sequence[LabelledDoc], positions_per_doc: int = 500, seed: int = 0) -> TrainingData:
    """Draw ``positions_per_doc`` body positions per document (one generator seeded ``seed``, documents in order)."""
    gen = torch.Generator().manual_seed(seed)
    sig, age, tgt, idx = [], [], [], []
    for d, doc in enumerate(docs):
        pos = doc_positions(doc, positions_per_doc, gen)
        if len(pos) == 0:
            continue
        t = doc.load()
        sig.append(torch.stack([t["beta"][:, pos], t["g"][:, pos], t["vnorm"][:, pos]], dim=-1).transpose(0, 1))
        age.append(age_features(doc.n, pos))
        tgt.append(normalised_utility(t["utility"], doc.prot)[:, :, pos].permute(2, 0, 1))
        idx.append(torch.full((len(pos),), d, dtype=torch.long))
    if not sig:
        raise KvbenchError("no training positions: every document is empty past its protected prefix")
    return TrainingData(torch.cat(sig).float(), torch.cat(age), torch.cat(tgt).float(), torch.cat(idx), list(docs))


def gate_means_from_labels(docs: Sequence[LabelledDoc], n_kv_heads: int) -> list[float]:
    """Per attention layer: the output gate averaged over all tokens of all documents (token-weighted) and the head
    dim, max over the query heads of each KV head, mean over KV heads (:meth:`ParentSession.gate_means` pooled)."""
    total, tokens = None, 0
    for doc in docs:
        g = doc.load()["gate_head_mean"].double() * doc.n  # [L, H]
        total = g if total is None else total + g
        tokens += doc.n
    if total is None:
        raise KvbenchError("no documents to measure the gate means on")
    per_head = total / tokens
    L, H = per_head.shape
    return per_head.view(L, n_kv_heads, H // n_kv_heads).amax(-1).mean(-1).tolist()


def _windows(labels_manifest: dict, window: int, age_only: bool) -> list[list[int]]:
    if age_only:
        return [[] for _ in labels_manifest["attn_layer_ids"]]
    return window_ordinals(labels_manifest["attn_layer_ids"], labels_manifest["gdn_layer_ids"], window)


def _feature_moments(
    data: TrainingData, window: Sequence[int], chunk: int = 65536
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population std of one layer's features over ``data`` (float64 accumulation)."""
    total = sq = None
    for start in range(0, len(data), chunk):
        x = data.layer_features(window, slice(start, start + chunk)).double()
        total = x.sum(0) if total is None else total + x.sum(0)
        sq = x.pow(2).sum(0) if sq is None else sq + x.pow(2).sum(0)
    mean = total / len(data)
    var = (sq / len(data) - mean.pow(2)).clamp_min(0)
    return mean.float(), var.sqrt().float()


def _clip_per_mlp(est: GateSightEstimator, max_norm: float) -> None:
    for f in range(est.n_layers):
        params = (est.w1[f], est.b1[f], est.w2[f], est.b2[f])
        sq = sum(p.grad.pow(2).reshape(p.shape[0], -1).sum(1) for p in params)  # [H_kv]
        scale = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
        for p in params:
            p.grad.mul_(scale.view(-1, *([1] * (p.dim() - 1))))


def train_estimator(
    data: TrainingData,
    manifest: dict,
    config: TrainConfig | None = None,
    *,
    gate_means: Sequence[float] | None = None,
    progress: bool = False,
    console=None,
    description: str = "training",
) -> GateSightEstimator:
    """Fit one MLP per (attention layer, KV head) on ``data``; returns the estimator with feature statistics,
    gate means (if given) and metadata (model identity from the label ``manifest``, training record)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    config = config or TrainConfig()
    windows = _windows(manifest, config.window, config.age_only)
    H_kv, Hv = int(manifest["n_kv_heads"]), int(manifest["n_value_heads"])
    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    est = GateSightEstimator(windows, H_kv, Hv, config.hidden)
    est.reset_parameters(gen)
    # standardisation with training-set statistics (streamed: a layer's features are assembled per chunk/batch)
    for f, w in enumerate(windows):
        mean, std = _feature_moments(data, w)
        est.set_feature_stats(f, mean, std)
    if gate_means is not None:
        est.gate_means.copy_(torch.tensor(list(gate_means), dtype=torch.float64))
    opt = torch.optim.AdamW(est.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    N = len(data)
    steps_per_epoch = math.ceil(N / config.batch_size)
    bce = torch.nn.BCEWithLogitsLoss(reduction="none")
    history = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
    )
    est.train()
    with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task(description, total=config.epochs * steps_per_epoch, loss=float("nan"))
        for _epoch in range(config.epochs):
            perm = torch.randperm(N, generator=gen)
            total, count = 0.0, 0
            for s in range(steps_per_epoch):
                rows = perm[s * config.batch_size : (s + 1) * config.batch_size]
                loss = 0.0
                for f, w in enumerate(windows):
                    logits = est.layer_logits(f, data.layer_features(w, rows))  # [H_kv, B]
                    loss = loss + bce(logits, data.target[rows, f].T).mean(dim=1).sum()
                opt.zero_grad(set_to_none=False)
                loss.backward()
                if config.grad_clip and config.grad_clip > 0:
                    _clip_per_mlp(est, config.grad_clip)
                opt.step()
                total += loss.item() * len(rows)
                count += len(rows)
                bar.update(task, advance=1, loss=total / count / (len(windows) * H_kv))
            history.append(total / count / (len(windows) * H_kv))
    est.eval()
    est.metadata = {
        "fingerprint": manifest["fingerprint"],
        "model": manifest.get("model", ""),
        **{k: manifest[k] for k in ("model_type", "attn_layer_ids", "gdn_layer_ids", "n_heads", "head_dim")},
        "window": config.window,
        "training": {
            "config": config.to_json(),
            "n_documents": len(data.docs),
            "n_positions": N,
            "corpora": sorted({d.corpus for d in data.docs}),
            "loss_per_epoch": history,
            "loss": "mean BCE per (layer, KV head) MLP",
        },
    }
    return est


def train_from_labels(
    labels: LabelSet,
    config: TrainConfig | None = None,
    *,
    exclude_corpora: Sequence[str] = (),
    progress: bool = False,
    console=None,
) -> GateSightEstimator:
    """Train on every document of ``labels`` (minus ``exclude_corpora``); gate means measured on the same documents."""
    config = config or TrainConfig()
    docs = [d for d in labels.docs if d.corpus not in set(exclude_corpora)]
    if not docs:
        raise KvbenchError("no labelled documents left to train on")
    data = build_training_data(docs, config.positions_per_doc, config.seed)
    gate = gate_means_from_labels(docs, int(labels.manifest["n_kv_heads"]))
    est = train_estimator(data, labels.manifest, config, gate_means=gate, progress=progress, console=console)
    est.metadata["training"]["labels"] = str(labels.root)
    est.metadata["training"]["label_recipe"] = labels.manifest.get("recipe", {})
    return est


def fit_ridge_chunks(
    chunks: Iterable[tuple[torch.Tensor, torch.Tensor]], alpha: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge regression with an unpenalised intercept from ``(x [n, d], y [n, K])`` chunks (sufficient statistics in
    float64): weights ``[d, K]``, intercept ``[K]``."""
    N, sx, sy, xx, xy = 0, None, None, None, None
    for x, y in chunks:
        x64, y64 = x.double(), y.double()
        N += x64.shape[0]
        if sx is None:
            sx, sy, xx, xy = x64.sum(0), y64.sum(0), x64.T @ x64, x64.T @ y64
        else:
            sx, sy, xx, xy = sx + x64.sum(0), sy + y64.sum(0), xx + x64.T @ x64, xy + x64.T @ y64
    if not N:
        raise KvbenchError("ridge regression needs at least one sample")
    xm, ym = sx / N, sy / N
    gram = xx - N * torch.outer(xm, xm) + alpha * torch.eye(xx.shape[0], dtype=torch.float64)
    w = torch.linalg.solve(gram, xy - N * torch.outer(xm, ym))
    return w.float(), (ym - xm @ w).float()


def fit_ridge(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge regression with an unpenalised intercept: ``x`` ``[N, d]`` (standardised), ``y`` ``[N, K]`` -> weights
    ``[d, K]``, intercept ``[K]`` (float64)."""
    return fit_ridge_chunks([(x, y)], alpha)


def fit_ridge_layer(
    data: TrainingData, est: GateSightEstimator, f: int, alpha: float = 1.0, chunk: int = 65536
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge on layer ``f``'s features standardised with ``est``'s statistics, against ``data``'s targets."""
    chunks = (
        (est.standardise(f, data.layer_features(est.windows[f], slice(s, s + chunk))), data.target[s : s + chunk, f])
        for s in range(0, len(data), chunk)
    )
    return fit_ridge_chunks(chunks, alpha)
