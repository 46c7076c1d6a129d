"""Predictor evaluation (paper §3.3, Appendix C, Table 5).

For every document, attention layer and KV head a predictor's scores over the body entries ``prot..n-1`` are
compared with the raw utility ``U``:

* Spearman ρ (average ranks for ties);
* overlap@k: the fraction of the true top-``k`` entries in the predicted top-``k``;
* coverage@k: the utility mass of the predicted top-``k`` over that of the true top-``k``;

with ``k = max(4, floor(k% · m))`` (``m`` body entries; the paper writes ``n``) for k% = 5, 10, 20. Ties in a
predictor's scores are broken by a seeded random permutation (a constant predictor is at chance, never
"oldest first"). Metrics are averaged over the KV heads, then over documents, per layer, and reported per
layer and as the layer mean.

Untrained signals (window = the estimator's window ``W(l)``): random; age (older first); ``|v|`` of the
preceding GDN layer; window means of ``beta``, ``-g``, retention ``exp(g)``, ``beta|v|``; ``|v|`` and
``beta|v|`` over slow heads (GDN heads whose median half-life ``ln 0.5 / mean(g)`` over all documents is at
least ``slow_threshold`` tokens, fixed once for every document). Learned: ridge regression on the
estimator's features and the per-head MLP (GateSight), both leave-one-corpus-out (each corpus predicted by
models trained on the others; with a single corpus, k-fold over documents), optionally the age-only MLP.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from kvbench.atomic import write_atomic
from kvbench.errors import KvbenchError

from .estimator import GateSightEstimator
from .features import layer_features, window_ordinals
from .labels import LabelledDoc, LabelSet
from .train import TrainConfig, build_training_data, fit_ridge_layer, gate_means_from_labels, train_estimator
from .utility import doc_seed

KS = (0.05, 0.10, 0.20)
METRICS = ("rho",) + tuple(f"ov@{round(k * 100)}" for k in KS) + tuple(f"cov@{round(k * 100)}" for k in KS)

__all__ = [
    "EvalConfig",
    "EvalResult",
    "METRICS",
    "evaluate_labels",
    "metrics_for_head",
    "render_markdown",
    "render_rich",
    "slow_heads",
    "spearman",
    "top_k",
]


# ----------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks 0..m-1 of ``x`` with ties given their average rank (float64)."""
    m = x.numel()
    order = torch.argsort(x, stable=True)
    sorted_x = x[order]
    ranks = torch.empty(m, dtype=torch.float64)
    ranks[order] = torch.arange(m, dtype=torch.float64)
    # group ties: average their ranks
    _, inverse, counts = torch.unique_consecutive(sorted_x, return_inverse=True, return_counts=True)
    if len(counts) < m:
        positions = torch.arange(m, dtype=torch.float64)
        sums = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inverse, positions)
        avg = sums / counts
        ranks[order] = avg[inverse]
    return ranks


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's ρ of two 1-D tensors (Pearson correlation of average ranks); 0 if either is constant."""
    ra, rb = average_ranks(a.flatten().double()), average_ranks(b.flatten().double())
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = ra.norm() * rb.norm()
    return float((ra @ rb) / denom) if denom > 0 else 0.0


def top_k(scores: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Indices of the ``k`` highest ``scores``; ties broken by a random permutation from ``generator``."""
    m = scores.numel()
    perm = torch.randperm(m, generator=generator) if generator is not None else torch.arange(m)
    order = torch.argsort(scores[perm], descending=True, stable=True)
    return perm[order[:k]]


def k_for(frac: float, m: int) -> int:
    """``max(4, floor(frac * m))``, at most ``m``."""
    return min(m, max(4, math.floor(frac * m + 1e-9)))


def metrics_for_head(pred: torch.Tensor, utility: torch.Tensor, generator: torch.Generator | None = None) -> dict:
    """All metrics of one (document, layer, KV head): ``pred`` and ``utility`` over the body entries."""
    pred, utility = pred.double().cpu(), utility.double().cpu()
    m = utility.numel()
    out = {"rho": spearman(pred, utility)}
    true_order = torch.argsort(utility, descending=True, stable=True)
    pred_order = top_k(pred, m, generator)
    for frac in KS:
        k = k_for(frac, m)
        t, p = true_order[:k], pred_order[:k]
        hit = torch.zeros(m, dtype=torch.bool)
        hit[t] = True
        out[f"ov@{round(frac * 100)}"] = float(hit[p].sum()) / k
        mass = float(utility[t].sum())
        out[f"cov@{round(frac * 100)}"] = float(utility[p].sum()) / mass if mass > 0 else float("nan")
    return out


# ----------------------------------------------------------------------------------------------------
# Predictors
# ----------------------------------------------------------------------------------------------------


def _mean_doc_g(doc: dict) -> torch.Tensor:
    return doc["g"].double().mean(dim=1)  # [L_gdn, Hv]


def half_lives(mean_g: torch.Tensor) -> torch.Tensor:
    """``ln 0.5 / mean(g)`` tokens (inf where the mean decay is 0)."""
    return torch.where(mean_g < 0, math.log(0.5) / mean_g.clamp(max=-1e-300), torch.full_like(mean_g, math.inf))


def slow_heads(docs: Sequence[LabelledDoc], threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slow [L_gdn, Hv] bool, median half-life [L_gdn, Hv])`` over ``docs``."""
    hl = torch.stack([half_lives(_mean_doc_g(d.load())) for d in docs])  # [docs, L_gdn, Hv]
    ordered, mid = hl.sort(dim=0).values, len(docs) // 2
    median = ordered[mid] if len(docs) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return median >= threshold, median


Predictor = Callable[[dict, int, LabelledDoc], torch.Tensor]  # (tensors, layer f, doc) -> [H_kv or 1, n]


def untrained_predictors(windows: Sequence[Sequence[int]], slow: torch.Tensor, seed: int) -> dict[str, Predictor]:
    """The untrained rows of Table 5 (``slow`` ``[L_gdn, Hv]``)."""

    def window_mean(fn):
        def pred(t, f, doc):
            w = list(windows[f])
            if not w:
                return torch.zeros(1, doc.n)
            return fn(t, w).mean(dim=(0, 2))[None]  # mean over window layers and heads

        return pred

    def slow_mean(fn):
        def pred(t, f, doc):
            w = list(windows[f])
            mask = slow[w] if w else torch.zeros(0, dtype=torch.bool)
            if not bool(mask.any()):
                return torch.zeros(1, doc.n)
            vals = fn(t, w).permute(1, 0, 2)[:, mask]  # [n, cells]
            return vals.mean(dim=1)[None]

        return pred

    def rand(t, f, doc):
        gen = torch.Generator().manual_seed(doc_seed(seed, doc.corpus, f"{doc.doc_id}#{f}"))
        return torch.rand(1, doc.n, generator=gen)

    def preceding_vnorm(t, f, doc):
        w = list(windows[f])
        return t["vnorm"][w[-1]].mean(dim=1)[None] if w else torch.zeros(1, doc.n)

    return {
        "random": rand,
        "age (older first)": lambda t, f, doc: -torch.arange(doc.n, dtype=torch.float64)[None],
        "‖v‖, preceding GDN layer": preceding_vnorm,
        "‖v‖, window mean": window_mean(lambda t, w: t["vnorm"][w]),  # Figure 2a's ‖v‖ (a window mean, its caption)
        "β, window mean": window_mean(lambda t, w: t["beta"][w]),
        "−g, window mean": window_mean(lambda t, w: -t["g"][w]),
        "retention exp(g), window mean": window_mean(lambda t, w: t["g"][w].exp()),
        "β‖v‖, window mean": window_mean(lambda t, w: t["beta"][w] * t["vnorm"][w]),
        "‖v‖ into slow heads": slow_mean(lambda t, w: t["vnorm"][w]),
        "slow-head β‖v‖": slow_mean(lambda t, w: t["beta"][w] * t["vnorm"][w]),
    }


def mlp_predictor(est: GateSightEstimator) -> Predictor:
    def pred(t, f, doc):
        x = layer_features(list(t["beta"]), list(t["g"]), list(t["vnorm"]), est.windows[f], doc.n)
        with torch.no_grad():
            return est.layer_logits(f, x)

    return pred


def ridge_predictor(est_stats: GateSightEstimator, weights: list[tuple[torch.Tensor, torch.Tensor]]) -> Predictor:
    """Ridge on the same standardised features (``est_stats`` supplies windows and statistics)."""

    def pred(t, f, doc):
        x = layer_features(list(t["beta"]), list(t["g"]), list(t["vnorm"]), est_stats.windows[f], doc.n)
        w, b = weights[f]
        return (est_stats.standardise(f, x) @ w + b).T

    return pred


# ----------------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------------


@dataclass
class EvalConfig:
    """What ``kvbench gatesight eval`` runs."""

    train: TrainConfig = field(default_factory=TrainConfig)
    slow_threshold: float = 1000.0
    ridge_alpha: float = 1.0
    age_control: bool = False
    seed: int = 0
    folds: int = 5  # k-fold by document when there is a single corpus


@dataclass
class EvalResult:
    """Per predictor: ``layer_mean`` metrics, ``per_layer`` (one dict per attention layer), ``per_corpus``."""

    predictors: dict[str, dict]
    groups: dict[str, str]
    split: str
    n_documents: int
    corpora: list[str]
    attn_layer_ids: list[int]
    notes: list[str]
    config: dict

    def to_json(self) -> dict:
        return asdict(self)


def _folds(labels: LabelSet, k: int) -> tuple[str, list[tuple[str, list[LabelledDoc], list[LabelledDoc]]]]:
    corpora = labels.corpora
    if len(corpora) >= 2:
        folds = [
            (c, [d for d in labels.docs if d.corpus != c], [d for d in labels.docs if d.corpus == c]) for c in corpora
        ]
        return "leave-one-corpus-out", folds
    docs = labels.docs
    if len(docs) < 2:
        raise KvbenchError("evaluation needs at least two labelled documents (held-out predictions)")
    k = min(k, len(docs))
    folds = []
    for i in range(k):
        test = docs[i::k]
        folds.append((f"fold{i}", [d for d in docs if d not in test], test))
    return f"{k}-fold by document (a single corpus: {corpora[0]})", folds


def doc_metrics(pred: torch.Tensor, utility: torch.Tensor, prot: int, gen: torch.Generator) -> dict:
    """Metrics of one (document, layer), averaged over KV heads. pred ``[H_kv or 1, n]``, utility ``[H_kv, n]``."""
    H_kv = utility.shape[0]
    per_head = [
        metrics_for_head(pred[h if pred.shape[0] > 1 else 0, prot:], utility[h, prot:], gen) for h in range(H_kv)
    ]
    return {m: sum(p[m] for p in per_head) / H_kv for m in METRICS}


def mean_of(dicts: Sequence[dict]) -> dict:
    return {m: sum(d[m] for d in dicts) / len(dicts) for m in METRICS} if dicts else {m: float("nan") for m in METRICS}


def evaluate_labels(
    labels: LabelSet,
    config: EvalConfig | None = None,
    *,
    artifact: GateSightEstimator | None = None,
    progress: bool = False,
    console=None,
) -> EvalResult:
    """Table 5 on a label directory (see the module docstring). With ``artifact`` the given estimator is
    evaluated on every document instead of the leave-one-corpus-out MLP/ridge (no training)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    config = config or EvalConfig()
    man = labels.manifest
    windows = window_ordinals(man["attn_layer_ids"], man["gdn_layer_ids"], config.train.window)
    L = len(windows)
    notes: list[str] = []
    slow, median_hl = slow_heads(labels.docs, config.slow_threshold)
    n_slow = int(slow.sum())
    notes.append(
        f"slow heads: {n_slow} of {slow.numel()} GDN heads have a median half-life >= {config.slow_threshold:g} tokens"
    )
    if n_slow == 0:
        notes.append("no slow heads: the slow-head rows score constants (chance level)")
    untrained = untrained_predictors(windows, slow, config.seed)
    groups = {name: "untrained" for name in untrained}
    if artifact is not None:
        if artifact.fingerprint and artifact.fingerprint != labels.fingerprint:
            raise KvbenchError(
                f"the artifact was trained for model {artifact.fingerprint[:16]}…, the labels are of "
                f"{labels.fingerprint[:16]}…"
            )
        split = "none (given artifact, every document)"
        folds = [("all", [], labels.docs)]
    else:
        split, folds = _folds(labels, config.folds)
    if artifact is not None:
        learned_names = ["GateSight (artifact)"]
    else:
        age = ["MLP, age features only"] if config.age_control else []
        learned_names = ["ridge regression", *age, "GateSight (per-head MLP)"]
    for name in learned_names:
        groups[name] = "learned"
    per_doc: dict[str, list[tuple[str, list[dict]]]] = {name: [] for name in groups}  # name -> [(corpus, [layer])]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task("evaluating", total=len(labels.docs))
        for fold_name, train_docs, test_docs in folds:
            learned: dict[str, Callable] = {}
            if artifact is not None:
                learned["GateSight (artifact)"] = mlp_predictor(artifact)
            else:
                bar.update(task, description=f"{fold_name}: training")
                data = build_training_data(train_docs, config.train.positions_per_doc, config.train.seed)
                gate = gate_means_from_labels(train_docs, int(man["n_kv_heads"]))
                est = train_estimator(data, man, config.train, gate_means=gate)
                weights = [fit_ridge_layer(data, est, f, config.ridge_alpha) for f in range(L)]
                learned["ridge regression"] = ridge_predictor(est, weights)
                if config.age_control:
                    age_cfg = TrainConfig(**{**config.train.to_json(), "age_only": True})
                    learned["MLP, age features only"] = mlp_predictor(train_estimator(data, man, age_cfg))
                learned["GateSight (per-head MLP)"] = mlp_predictor(est)
            for doc in test_docs:
                bar.update(task, description=f"{fold_name}: {doc.doc_id}"[:60])
                t = doc.load()
                u = t["utility"]
                for name, fn in {**untrained, **learned}.items():
                    gen = torch.Generator().manual_seed(config.seed)
                    layers = [doc_metrics(fn(t, f, doc).float(), u[f], doc.prot, gen) for f in range(L)]
                    per_doc[name].append((doc.corpus, layers))
                bar.advance(task)
    predictors = {}
    for name, rows in per_doc.items():
        per_layer = [mean_of([layers[f] for _, layers in rows]) for f in range(L)]
        per_corpus = {}
        for c in sorted({c for c, _ in rows}):
            docs_c = [layers for cc, layers in rows if cc == c]
            per_corpus[c] = mean_of([mean_of([layers[f] for layers in docs_c]) for f in range(L)])
        predictors[name] = {"layer_mean": mean_of(per_layer), "per_layer": per_layer, "per_corpus": per_corpus}
    cfg = {**asdict(config), "median_half_life": median_hl.tolist(), "slow_heads": slow.tolist()}
    return EvalResult(
        predictors, groups, split, len(labels.docs), labels.corpora, list(man["attn_layer_ids"]), notes, cfg
    )


# ----------------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------------


def _fmt(metric: str, value: float) -> str:
    if value != value:  # NaN
        return "—"
    return f"{value:+.3f}" if metric == "rho" else f"{100 * value:.1f}"


def _best(result: EvalResult) -> dict[str, float]:
    return {
        m: max(
            (p["layer_mean"][m] for p in result.predictors.values() if p["layer_mean"][m] == p["layer_mean"][m]),
            default=float("nan"),
        )
        for m in METRICS
    }


HEADERS = ["Predictor", "ρ (↑)", "Ov@5", "Ov@10", "Ov@20", "Cov@5", "Cov@10", "Cov@20"]


def render_markdown(result: EvalResult) -> str:
    """Table 5 (layer means) and a per-layer table of ρ and Ov@10, as markdown."""
    best = _best(result)
    lines = [
        f"GateSight predictor evaluation: {result.n_documents} documents, corpora {', '.join(result.corpora)}; "
        f"learned predictors: {result.split}. Ov@k and Cov@k in %, averaged over KV heads, documents, then "
        f"{len(result.attn_layer_ids)} attention layers. Best in bold.",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    for group, title in (("untrained", "*Untrained signals*"), ("learned", "*Learned predictors*")):
        lines.append(f"| {title} |" + " |" * (len(HEADERS) - 1))
        for name, p in result.predictors.items():
            if result.groups[name] != group:
                continue
            cells = []
            for m in METRICS:
                s = _fmt(m, p["layer_mean"][m])
                cells.append(f"**{s}**" if p["layer_mean"][m] == best[m] else s)
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Per attention layer (ρ / Ov@10 %):", ""]
    layer_heads = [f"layer {i}" for i in result.attn_layer_ids]
    lines.append("| Predictor | " + " | ".join(layer_heads) + " |")
    lines.append("|" + "---|" * (len(layer_heads) + 1))
    for name, p in result.predictors.items():
        cells = [f"{_fmt('rho', d['rho'])} / {_fmt('ov@10', d['ov@10'])}" for d in p["per_layer"]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if result.notes:
        lines += [""] + [f"- {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def render_rich(result: EvalResult):
    """A rich Table of the layer means (Table 5)."""
    from rich.table import Table

    best = _best(result)
    table = Table(title=f"GateSight predictors — {result.n_documents} docs, {result.split}")
    for h in HEADERS:
        table.add_column(h, justify="left" if h == "Predictor" else "right")
    for group, title in (("untrained", "Untrained signals"), ("learned", "Learned predictors")):
        table.add_row(f"[italic]{title}[/italic]", *[""] * (len(HEADERS) - 1), end_section=False)
        names = [n for n in result.predictors if result.groups[n] == group]
        for i, name in enumerate(names):
            p = result.predictors[name]["layer_mean"]
            cells = [f"[bold]{_fmt(m, p[m])}[/bold]" if p[m] == best[m] else _fmt(m, p[m]) for m in METRICS]
            table.add_row(name, *cells, end_section=i == len(names) - 1)
    return table


def write_result(result: EvalResult, out: str | Path) -> tuple[Path, Path]:
    """``out/gatesight_eval.json`` and ``out/gatesight_eval.md``."""
    out = Path(out)
    js, md = out / "gatesight_eval.json", out / "gatesight_eval.md"
    write_atomic(js, json.dumps(result.to_json(), indent=2, sort_keys=False) + "\n")
    write_atomic(md, render_markdown(result))
    return js, md
