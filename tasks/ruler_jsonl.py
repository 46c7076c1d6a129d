"""RULER's jsonl schema: kvbench's RULER items written as RULER's ``scripts/data/prepare.py`` writes them
(``kvbench ruler generate``), to diff against files RULER's own scripts wrote."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from kvbench.atomic import write_atomic
from kvbench.errors import KvbenchError
from kvbench.prompt import prompt_length, prompt_text
from kvbench.tasks import Context
from kvbench.tasks.ruler import TASKS, generate

__all__ = ["ruler_row", "write_ruler_jsonl"]


def ruler_row(index: int, ctx: Context, full_text: str, text_tokens: Callable[[str], int]) -> dict:
    """RULER's jsonl row for one kvbench context (``prepare.py``'s schema, key order included).

    full_text: the whole prompt (``kvbench.prompt.prompt_text``), which ends with the answer prefix.
    ``input`` is the text before the answer prefix (with its separating space under the base template,
    where RULER's ``answer_prefix`` starts with that space); ``length`` is ``meta["prompt_tokens"]`` plus
    ``max_new_tokens``; niah rows replace ``index`` with the answer's character offset in ``input`` and
    add ``token_position_answer``, the tokens before it, as RULER's niah.py does.
    """
    q = ctx.questions[0]
    cut = full_text.rfind(q.answer_prefix) if q.answer_prefix else len(full_text)
    if cut > 0 and full_text[cut - 1] == " ":
        cut -= 1  # RULER's answer prefix carries the space
    text, prefix = full_text[:cut], full_text[cut:]
    length = int(ctx.meta["prompt_tokens"]) + q.max_new_tokens
    outputs = list(q.references)
    if ctx.task.startswith("niah"):
        pos = text.find(outputs[0])
        return {
            "index": pos,
            "input": text,
            "outputs": outputs,
            "length": length,
            "length_w_model_temp": length,
            "answer_prefix": prefix,
            "token_position_answer": text_tokens(text[:pos]),
        }
    return {
        "index": index,
        "input": text,
        "outputs": outputs,
        "length": length,
        "length_w_model_temp": length,
        "answer_prefix": prefix,
    }


def write_ruler_jsonl(
    tokenizer, task: str, *, length: int, limit: int, seed: int, out, sampling: str = "official"
) -> int:
    """Write ``limit`` items of RULER ``task`` in RULER's jsonl schema to ``out`` (atomically: a
    temporary file beside it, then a rename, so an existing file is replaced whole or not at all).
    ``tokenizer``: a Hugging Face tokenizer; its chat template, if any, wraps the prompt. Returns the
    number of rows written. Data files come from ``$KVBENCH_DATA_DIR`` as for ``kvbench run``."""
    if task not in TASKS:
        raise KvbenchError(f"unknown RULER task {task!r}; valid tasks: {', '.join(TASKS)}")
    measure = prompt_length(tokenizer)
    out = Path(out)
    rows = [
        ruler_row(i, ctx, prompt_text(tokenizer, ctx), measure.text_tokens)
        for i, ctx in enumerate(
            generate("ruler", task, length=length, limit=limit, seed=seed, prompt_length=measure, sampling=sampling)
        )
    ]
    write_atomic(out, "".join(json.dumps(row, ensure_ascii=True) + "\n" for row in rows))
    return len(rows)
