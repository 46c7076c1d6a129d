"""Stand-in for ``torchvision.transforms`` (see the package docstring)."""

from torchvision import make_enum, module_getattr

InterpolationMode = make_enum(
    "InterpolationMode", ("NEAREST", "NEAREST_EXACT", "BILINEAR", "BICUBIC", "BOX", "HAMMING", "LANCZOS")
)
__getattr__ = module_getattr(__name__)
