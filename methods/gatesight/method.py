"""The ``gatesight`` eviction method: learned future-utility scores from the native GDN signals.

Scores: per attention layer, the per-(layer, KV head) MLPs of the trained artifact applied to the window
features of every context entry (one matrix product per layer, linear in ``n``; no attention score, no extra
pass). Returned as logits, a strictly monotone map of the predicted utility ``sigmoid(logit)``: every
allocation (including ``global``) selects the same entries as with the probabilities, and logits never
saturate into ties. Default allocation ``gate``, with the artifact's calibrated gate means (measured on the
label corpus) as the per-layer weights.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from kvbench.artifacts import ReadOnce, find_calibration, shipped_alternative
from kvbench.engines.base import ParentSession
from kvbench.errors import KvbenchError
from kvbench.methods import EvictionMethod, register_method

from .estimator import ARTIFACT_ENV, PRODUCE_COMMAND, GateSightEstimator, default_artifact_dir, load_artifact

__all__ = ["GateSight"]


@register_method
class GateSight(EvictionMethod):
    """GateSight (paper §4): per-head MLPs over the native GDN signals decide which entries each layer keeps;
    the attention output gate decides how many (``gate`` allocation).

    Artifact lookup, first match wins: ``artifact`` (constructor argument or class/instance attribute), the
    shipped alternative calibration the ``calibration`` option names (``--set gatesight.calibration=NAME``,
    :func:`kvbench.artifacts.shipped_alternative`), the environment variable ``KVBENCH_GATESIGHT_ARTIFACT``,
    then ``$KVBENCH_CACHE/calibration/gatesight/
    <fingerprint[:16]>/``. The model fingerprint is ``fingerprint`` (argument/attribute) or the parent's
    ``model_fingerprint``; whenever it is known it must equal the artifact's. Absence,
    a fingerprint mismatch or a shape mismatch (layers, KV heads, GDN layout, value heads) is a
    :class:`KvbenchError` naming ``kvbench gatesight label … && kvbench gatesight train …``.
    """

    name = "gatesight"
    default_allocation = "gate"
    artifact: str | os.PathLike | None = None
    calibration = ""
    options = {
        "calibration": "a shipped alternative calibration of the built-in models instead of the default one "
        "(docs/methods.md#calibration-corpora names them)",
    }

    def __init__(self, seed: int = 0, artifact: str | os.PathLike | None = None, fingerprint: str | None = None):
        super().__init__(seed)
        if artifact is not None:
            self.artifact = artifact
        if fingerprint is not None:
            self.fingerprint = fingerprint
        self._cache: ReadOnce[GateSightEstimator] = ReadOnce(load_artifact)

    @classmethod
    def prepare_offline(cls, model: torch.nn.Module, tokenizer, workdir: Path, *, seed: int = 0) -> GateSight:
        """An estimator labelled and trained (one epoch) on two short documents of ``model``, saved under
        ``workdir`` (``labels/``, ``artifact``): an instance for offline checks on a small model."""
        from kvbench.corpus import Document
        from kvbench.models import fingerprint

        from .estimator import save_artifact
        from .labels import label_corpus, load_labels
        from .train import TrainConfig, train_from_labels
        from .utility import LabelConfig

        docs = [
            Document("a", "d0", "alpha = 12; beta = 34; gamma = 56; delta = 78;"),
            Document("b", "d1", "kappa = 90; zeta = 11; omega = 23; sigma = 45;"),
        ]
        fp = fingerprint(model, tokenizer)
        config = LabelConfig(m=2, max_new_tokens=4)
        label_corpus(model, tokenizer, docs, workdir / "labels", config, fingerprint=fp, progress=False)
        estimator = train_from_labels(load_labels(workdir / "labels"), TrainConfig(epochs=1, batch_size=16))
        save_artifact(estimator, workdir / "artifact")
        return cls(seed=seed, artifact=workdir / "artifact", fingerprint=fp)

    def resolve_artifact(self, parent: ParentSession | None = None) -> Path:
        """Where the artifact for ``parent``'s model is read (the lookup order of the class docstring)."""
        return self._artifact_path(self.model_fingerprint(parent))

    def _artifact_path(self, fingerprint: str | None) -> Path:
        if self.artifact is not None:
            return Path(self.artifact)
        if self.calibration and fingerprint:
            return shipped_alternative(self.calibration, default_artifact_dir(fingerprint))
        env = os.environ.get(ARTIFACT_ENV)
        if env:
            return Path(env)
        if fingerprint:
            return find_calibration(default_artifact_dir(fingerprint))
        raise KvbenchError(
            "GateSight cannot locate its artifact: no `artifact` is set, $" + ARTIFACT_ENV + " is unset and the "
            f"model fingerprint is unknown (set `fingerprint` on the method); produce one with `{PRODUCE_COMMAND}`"
        )

    def _estimator(self, fingerprint: str | None) -> GateSightEstimator:
        """The artifact for that fingerprint, read once per path and fingerprint (fingerprint-checked)."""
        path = self._artifact_path(fingerprint)
        return self._cache.get(path, fingerprint)

    def artifact_sha256(self, model_fingerprint: str | None) -> str | None:
        """The SHA-256 of the estimator weights file this instance scores that model with (read here, once)."""
        return self._estimator(self.fingerprint or model_fingerprint).sha256

    def load(self, parent: ParentSession | None = None) -> GateSightEstimator:
        """The artifact for ``parent``'s model (read once per path and fingerprint, moved to the parent's
        device), shape-checked."""
        fp = self.model_fingerprint(parent)
        est = self._estimator(fp)
        if parent is not None:
            if parent.n_attn_layers:
                est.to(parent.keys(0).device)  # in place: the cached estimator is the one whose digest rows record
            self._check(est, parent, self._artifact_path(fp))
        return est

    @staticmethod
    def _check(est: GateSightEstimator, parent: ParentSession, path: Path) -> None:
        meta = est.metadata
        problems = []
        if est.n_layers != parent.n_attn_layers:
            problems.append(f"{est.n_layers} attention layers (model: {parent.n_attn_layers})")
        if est.n_kv_heads != parent.n_kv_heads:
            problems.append(f"{est.n_kv_heads} KV heads (model: {parent.n_kv_heads})")
        if list(meta.get("attn_layer_ids", parent.attn_layer_ids)) != list(parent.attn_layer_ids):
            problems.append(f"attention layers {meta.get('attn_layer_ids')} (model: {parent.attn_layer_ids})")
        if list(meta.get("gdn_layer_ids", parent.gdn_layer_ids)) != list(parent.gdn_layer_ids):
            problems.append(f"GDN layers {meta.get('gdn_layer_ids')} (model: {parent.gdn_layer_ids})")
        signals = parent.signals()
        hv = signals.beta[0].shape[-1] if signals.beta else 0
        if est.n_value_heads != hv:
            problems.append(f"{est.n_value_heads} GDN value heads (model: {hv})")
        if any(o >= len(signals.beta) for w in est.windows for o in w):
            problems.append("windows reading GDN layers the model does not have")
        if problems:
            raise KvbenchError(
                f"the GateSight artifact at {path} does not fit this model: it has {'; '.join(problems)}; train one "
                f"for this model with `{PRODUCE_COMMAND}`"
            )

    def score(self, parent: ParentSession) -> list[torch.Tensor]:
        est = self.load(parent)
        s = parent.signals()
        return est.score_signals(s.beta, s.g, s.vnorm, parent.n)

    def gate_means(self, parent: ParentSession) -> list[float]:
        """The artifact's calibrated per-layer gate means (measured on the label corpus), not the context's."""
        return [float(x) for x in self.load(parent).gate_means.tolist()]
