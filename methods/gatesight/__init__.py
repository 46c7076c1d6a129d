"""GateSight (paper: "GateSight: recurrent memory anticipates attention memory for query-agnostic KV eviction
in hybrid LLMs"): the method kvbench was built around.

* :mod:`.utility` — the future-utility label (Eq. 2) in closed form, its brute-force reference, sampling,
  one-document labelling with the Appendix B checks, corpus reading;
* :mod:`.labels` — labelling a corpus into a label directory and reading it back;
* :mod:`.features` — the window features of Eq. 3;
* :mod:`.estimator` — the per-(layer, KV head) MLPs and the artifact;
* :mod:`.train` — the training recipe and ridge regression;
* :mod:`.evaluate` — Table 5 (untrained signals, ridge, MLP; leave-one-corpus-out);
* :mod:`.method` — the ``gatesight`` eviction method (registered on import);
* :mod:`.cli` — ``kvbench gatesight label | train | eval``.
"""

from __future__ import annotations

from kvbench.lazy import lazy_attributes

# name -> the submodule that defines it, imported on first use: importing the package (as ``kvbench gatesight
# --help`` and ``kvbench paper --help`` do, for the apps in .cli and .paper) imports no torch
_WHERE = {
    "ARTIFACT_ENV": ".estimator",
    "PRODUCE_COMMAND": ".estimator",
    "GateSightEstimator": ".estimator",
    "default_artifact_dir": ".estimator",
    "load_artifact": ".estimator",
    "save_artifact": ".estimator",
    "age_features": ".features",
    "feature_dims": ".features",
    "layer_features": ".features",
    "window_ordinals": ".features",
    "GateSight": ".method",
}

__all__ = [
    "ARTIFACT_ENV",
    "PRODUCE_COMMAND",
    "GateSight",
    "GateSightEstimator",
    "age_features",
    "default_artifact_dir",
    "feature_dims",
    "layer_features",
    "load_artifact",
    "save_artifact",
    "window_ordinals",
]

__getattr__, __dir__ = lazy_attributes(__name__, _WHERE)
