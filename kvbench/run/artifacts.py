"""The offline artifacts a run's methods score with (:func:`method_artifacts`): each method reads its artifact
before anything is written, and a results directory never mixes two artifacts' rows under one method label.
"""

from __future__ import annotations

from typing import Sequence

from kvbench.errors import KvbenchError
from kvbench.methods import EvictionMethod
from kvbench.models import LoadedModel
from kvbench.results.store import ResultsStore


def method_artifacts(
    plan: Sequence[tuple[EvictionMethod, list[str], list[float]]], lm: LoadedModel, store: ResultsStore
) -> dict[str, str | None]:
    """``{method label: artifact_sha256}`` of the plan's methods for ``lm``. Each method reads its offline
    artifact here, so a missing or mismatched one fails before anything is written. A method whose rows in
    ``store``'s directory (same model, same weights) were scored with another artifact is an error: rows of two
    calibrations under one label would be mixed."""
    artifacts: dict[str, str | None] = {}
    for method, _, _ in plan:
        sha = method.artifact_sha256(lm.fingerprint)
        if sha is not None and not (isinstance(sha, str) and sha):
            raise KvbenchError(
                f"method {method.name}: artifact_sha256() returned {sha!r}; it must return the artifact's hex "
                "digest (a non-empty str), or None for a method without an artifact"
            )
        artifacts[method.label] = sha

    def short(d: str) -> str:
        return "none" if d == "None" else d[:12] + "…"

    recorded = store.recorded_artifacts(lm.name, lm.fingerprint)
    for label, sha in artifacts.items():
        other = sorted(recorded.get(label, set()) - {str(sha)})
        if other:
            raise KvbenchError(
                f"{store.dir} holds {label} rows of model {lm.name} scored with another artifact (sha256 "
                f"{', '.join(map(short, other))}) than this run's ({short(str(sha))}), e.g. from before a "
                "recalibration; the two would be mixed under one name. Run into a new --out directory (or move "
                "the older results files away)"
            )
    return artifacts
