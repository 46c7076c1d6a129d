"""Stand-in for ``torchvision.transforms.v2.functional`` (see the package docstring)."""

from torchvision import module_getattr

__getattr__ = module_getattr(__name__)
