"""kvbench's import-only stand-in for torchvision (see ``kvbench/engines/vllm_stubs/README.md``): names import,
any use raises."""

from __future__ import annotations

import enum

MESSAGE = (
    "torchvision is not installed: this is kvbench's import-only stand-in, which lets vLLM load text-only "
    "Qwen3.5; {name} cannot be used. Install a CPU torchvision build into the vLLM environment for image inputs"
)


class Missing:
    """A torchvision name that imports but cannot be used: calling it raises; attributes are Missing too."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise ModuleNotFoundError(MESSAGE.format(name=self._name))

    def __repr__(self) -> str:
        return f"<missing {self._name}>"


def module_getattr(module: str):
    """A module-level ``__getattr__`` serving every other name of ``module`` as :class:`Missing`."""

    def __getattr__(name: str) -> Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return Missing(f"{module}.{name}")

    return __getattr__


def make_enum(name: str, members: tuple[str, ...]) -> type[enum.Enum]:
    """An enum standing in for one of torchvision's (used as default arguments at import time)."""
    return enum.Enum(name, [(m, m.lower()) for m in members])


__getattr__ = module_getattr(__name__)
