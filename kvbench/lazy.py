"""Lazy re-exports: a package that re-exports names from heavy submodules (torch) without importing them.

``__getattr__, __dir__ = lazy_attributes(__name__, {"GateSight": ".method", …})`` at the bottom of a package's
``__init__`` makes ``package.GateSight`` import ``.method`` on first use, so that importing the package (as
the command line does to reach a typer app in one of its modules) stays light.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(module: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` for ``module``: each name of ``where`` (name -> the module that
    defines it, absolute or relative to ``module``, which must be a package for a relative one) is imported on
    first use and then kept in ``module``'s namespace; any other name is an AttributeError."""

    def getattr_(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], module), name)
        setattr(sys.modules[module], name, value)
        return value

    def dir_() -> list[str]:
        return sorted(set(vars(sys.modules[module])) | set(where))

    return getattr_, dir_
