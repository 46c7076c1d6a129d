"""The filter of transformers' fallback-kernel warnings: one short line instead of four long ones.

It lives apart from :mod:`kvbench.engines.hf_adapters` (which imports torch) so that the command line can
install it before any command runs while ``kvbench <command> --help`` still imports no torch; it only names
transformers' logger, it imports nothing of transformers.
"""

from __future__ import annotations

import logging

__all__ = ["FALLBACK_SUMMARY", "KernelWarningFilter", "quiet_kernel_warnings"]

#: transformers logs one warning per GDN kernel it runs without its optional fast package.
_FALLBACK_LOGGER = "transformers.integrations.hub_kernels"
_FALLBACK_TEXT = "is falling back to its reference PyTorch implementation"
FALLBACK_SUMMARY = (
    "note: the optional fast GDN kernels (causal_conv1d, flash-linear-attention) are not installed; "
    "transformers runs its reference PyTorch kernels (slower, same results). --verbose shows the details"
)


class KernelWarningFilter(logging.Filter):
    """Turns transformers' fallback-kernel warnings into one short line, once (all of them when ``verbose``)."""

    def __init__(self) -> None:
        super().__init__()
        self.verbose = False
        self.shown = False

    def filter(self, record: logging.LogRecord) -> bool:
        """Pass other records; the first fallback warning becomes :data:`FALLBACK_SUMMARY`, later ones drop."""
        if self.verbose or _FALLBACK_TEXT not in record.getMessage():
            return True
        if self.shown:
            return False
        self.shown = True
        record.msg, record.args = FALLBACK_SUMMARY, ()
        return True


def quiet_kernel_warnings() -> KernelWarningFilter:
    """Install (once) and return the filter on transformers' kernel logger; set ``.verbose`` to show all."""
    logger = logging.getLogger(_FALLBACK_LOGGER)
    for f in logger.filters:
        if isinstance(f, KernelWarningFilter):
            return f
    f = KernelWarningFilter()
    logger.addFilter(f)
    return f
