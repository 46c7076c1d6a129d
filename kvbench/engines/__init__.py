"""Engines: what prefills a context into a parent session and forks its children.

Engines are registered in :data:`ENGINES` as classes, subclasses of :class:`~kvbench.engines.base.EngineBase`
constructed ``(lm, length, device)``: ``lm`` the loaded model (:class:`~kvbench.models.LoadedModel`), ``length``
the longest prompt in tokens the engine must hold, ``device`` the torch device (``"cpu"``, ``"cuda"``, …). Each
class declares (``EngineBase`` documents them):

* ``prefill`` (the engine), ``fork`` and ``answer`` (its parent sessions), ``answer`` (its child sessions);
* ``torch_weights``: False for an engine that loads the checkpoint itself; ``kvbench run`` then gives it a ``lm``
  without a torch copy of the weights (config, tokenizer and fingerprint; ``lm.model`` on the ``meta`` device);
* ``capabilities``: the names of :data:`CAPABILITIES` it offers; a method that needs one declares it in its
  ``requires`` and runs only on the engines that offer it (:func:`engines_for`).

Built-ins: ``torch`` (:class:`~kvbench.engines.torch_engine.TorchRunEngine`, any device) and ``vllm``
(:class:`~kvbench.engines.vllm_engine.VllmRunEngine`, vLLM environment only); plugins through the
``kvbench.engines`` entry-point group (``myengine = mypkg.engine:MyEngine``).

This package imports nothing heavy: the registry names each class as ``"module:class"`` and imports it on
first use (its module imports torch).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from kvbench.errors import KvbenchError
from kvbench.registry import Registry, RegistryError

if TYPE_CHECKING:
    from kvbench.engines.base import EngineBase

__all__ = ["BUILTIN_ENGINES", "CAPABILITIES", "ENGINES", "VLLM_HEADROOM", "engines_for"]

VLLM_HEADROOM = 512  # tokens past --length the vllm engine reserves for question and answer

#: What an engine may offer beyond the protocol (``EngineBase.capabilities``), name -> what it means. A method
#: that needs one names it in its ``requires``.
CAPABILITIES: dict[str, str] = {
    "model_weights": "the engine's ``adapter`` (a HybridAdapter) exposes the model's torch attention modules, "
    "e.g. each layer's output projection W_O (a method that recomputes attention outputs reads it)",
    "ragged_heads": "a fork keeps different counts for the KV heads of one layer (a ragged allocation)",
}

#: The built-in engines: name -> "module:class".
BUILTIN_ENGINES: dict[str, str] = {
    "torch": "kvbench.engines.torch_engine:TorchRunEngine",
    "vllm": "kvbench.engines.vllm_engine:VllmRunEngine",
}


def _check_engine(name: str, cls: object) -> None:
    """An engine is an :class:`EngineBase` subclass constructed ``(lm, length, device)`` that declares
    ``torch_weights`` (bool) and ``capabilities`` (known names)."""
    from kvbench.engines.base import EngineBase

    if not (isinstance(cls, type) and issubclass(cls, EngineBase)):
        raise RegistryError(f"engine {name!r}: {cls!r} is not an EngineBase subclass")
    try:
        inspect.signature(cls).bind(None, 0, "cpu")
    except TypeError as exc:
        raise RegistryError(
            f"engine {name!r}: {cls.__qualname__} is not constructed (lm, length, device): {exc}"
        ) from None
    if not isinstance(cls.torch_weights, bool):
        raise RegistryError(f"engine {name!r}: torch_weights must be a bool, not {cls.torch_weights!r}")
    if not isinstance(cls.capabilities, frozenset) or not cls.capabilities <= CAPABILITIES.keys():
        raise RegistryError(
            f"engine {name!r}: capabilities must be a frozenset of {', '.join(CAPABILITIES)}; got {cls.capabilities!r}"
        )


#: Every engine (``--engine``): built-ins and ``kvbench.engines`` entry points, name -> its class.
ENGINES: Registry[type[EngineBase]] = Registry("engine", "kvbench.engines", BUILTIN_ENGINES, check=_check_engine)


def engines_for(method: type) -> tuple[str, ...] | None:
    """The engines (``--engine`` names) method class ``method`` runs on, None for every engine: those of its
    ``engines`` (None: every registered engine) offering every capability of its ``requires``. Imports the
    engine classes only for a method that requires a capability."""
    if not method.requires:
        return method.engines
    names = ENGINES.names() if method.engines is None else method.engines
    fit = tuple(name for name in names if method.requires <= ENGINES.get(name).capabilities)
    if not fit:
        raise KvbenchError(
            f"method {method.name} requires {', '.join(sorted(method.requires))}, which no engine offers "
            f"(engines: {', '.join(names)})"
        )
    return fit
