"""The command line's shared options, declared once (:data:`DEVICE`, :data:`DTYPE`, :data:`THREADS`, :data:`ENGINE`:
every command that loads a model takes them with the same meaning and help), and how ``kvbench … --help`` shows
options: a flag (``--verbose``, ``--resume/--no-resume``, ``--help``) takes no
value, so its row shows no value placeholder. typer's rich help gives every option one, ``<bool>`` for flags,
which reads as if the flag wanted ``--verbose true``; :func:`hide_flag_placeholders` drops it for flags only."""

from __future__ import annotations

import typer
from typer.core import TyperOption

from kvbench.engines import ENGINES

#: ``--device``: where torch runs the model.
DEVICE = typer.Option("cpu", "--device", metavar="[cpu|cuda|cuda:N|mps]", help="torch device.")
#: ``--dtype``: the weights' dtype (kvbench.models.DTYPES).
DTYPE = typer.Option(
    None, "--dtype", metavar="[float32|bfloat16|float16]", help="Weights dtype (default: fp32 on CPU, bf16 on GPU)."
)
#: ``--threads``: torch's CPU threads.
THREADS = typer.Option(None, "--threads", help="torch CPU threads (>= 1).")
#: ``--engine``: the inference engine, one of the engines registry's names (kvbench.engines.ENGINES).
ENGINE = typer.Option("torch", "--engine", metavar=f"[{'|'.join(ENGINES)}]", help="Inference engine.")


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
