"""Stand-in for ``torchvision.io`` (see the package docstring)."""

from torchvision import make_enum, module_getattr

ImageReadMode = make_enum("ImageReadMode", ("UNCHANGED", "GRAY", "GRAY_ALPHA", "RGB", "RGB_ALPHA", "RGBA"))
__getattr__ = module_getattr(__name__)
