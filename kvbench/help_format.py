"""How ``kvbench … --help`` shows options: a flag (``--verbose``, ``--resume/--no-resume``, ``--help``) takes no
value, so its row shows no value placeholder. typer's rich help gives every option one, ``<bool>`` for flags,
which reads as if the flag wanted ``--verbose true``; :func:`hide_flag_placeholders` drops it for flags only."""

from __future__ import annotations

from typer.core import TyperOption


def hide_flag_placeholders() -> None:
    """Make the help of every typer option that is a flag show no type placeholder (idempotent; other options
    keep typer's ``<int>``, ``<path>``, ``[a|b]`` …)."""
    shown = TyperOption.display_type_rich
    if getattr(shown, "kvbench_flags_hidden", False):
        return

    def display_type_rich(self: TyperOption, ctx) -> str | None:
        if self.is_flag and self.metavar is None:
            return None
        return shown(self, ctx)

    display_type_rich.kvbench_flags_hidden = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]
