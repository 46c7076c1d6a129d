"""SCBench's own prompt assembly: the :class:`~kvbench.tasks.Assembly` of contexts whose ``assembly`` is
``"scbench"`` (SCBench declares it in ``SCBenchBench.assemblies``; :mod:`kvbench.prompt` renders with it).

As ``create_scdq_prompt`` and ``run_scbench.py`` of microsoft/MInference build a shared-context multi-query
prompt, token for token:

* the context prompt is the chat template applied to one user message ``instruction + glue + body`` (the
  official ``CTX_TEMPLATE.format(context)``; SCBench contexts use an empty glue) followed by the delimiter
  ``[SEPSEPSEP]``, with the generation prompt, cut before the delimiter, and encoded in one call with the
  tokenizer's default special tokens (the official ``tok.encode``);
* each query is the chat template applied to ``[system "", user "[SEPSEPSEP]" + question]`` with the
  generation prompt, cut after the delimiter, encoded without special tokens and appended directly to the
  context (no separator), then the answer prefix;
* the context prompt's ids are middle-truncated to ``L = max_length - context.reserve_tokens`` when longer
  (the first ``L // 2`` and last ``L // 2`` ids, as the official ``truncate_input``); a negative ``L`` cuts
  nothing (as the official), and ``L`` of 0 or 1, where the official run fails its own assertion, is an
  error;
* the protected prefix is the part of those ids that encodes the template head and the instruction.

Without a chat template both are the plain texts (the official ``use_chat_template=False``).
"""

from __future__ import annotations

from kvbench.errors import KvbenchError
from kvbench.prompt import Rendered, encode
from kvbench.tasks import Assembly, Context, Question

__all__ = ["ASSEMBLY", "SCBenchAssembly"]

_SEP = "[SEPSEPSEP]"  # the official scdq delimiter


def _context_text(tokenizer, text: str) -> str:
    """The official scdq context prompt of user content ``text``: chat head + ``text`` (as the template
    writes it), no end of turn."""
    if not getattr(tokenizer, "chat_template", None):
        return text
    templated = tokenizer.apply_chat_template(
        [{"role": "user", "content": text + _SEP}], add_generation_prompt=True, tokenize=False
    )
    return templated.split(_SEP)[0]


def _query_text(tokenizer, question: Question) -> str:
    """The official scdq query prompt of ``question``: its text + end of turn + assistant header (from a
    ``[system "", user]`` conversation), then the answer prefix."""
    if not getattr(tokenizer, "chat_template", None):
        return question.text + question.answer_prefix
    templated = tokenizer.apply_chat_template(
        [{"role": "system", "content": ""}, {"role": "user", "content": _SEP + question.text}],
        add_generation_prompt=True,
        tokenize=False,
    )
    return templated.split(_SEP)[1] + question.answer_prefix


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class SCBenchAssembly(Assembly):
    """SCBench's shared-context assembly (module docstring)."""

    name = "scbench"

    def prompt_text(self, tokenizer, context: Context, j: int = 0) -> str:
        text = _context_text(tokenizer, context.instruction + context.glue + context.body)
        return text + _query_text(tokenizer, context.questions[j])

    def render(self, tokenizer, context: Context, max_length: int | None = None) -> Rendered:
        head = context.instruction + context.glue
        context_ids = list(tokenizer.encode(_context_text(tokenizer, head + context.body)))
        n_prefix = _common_prefix(list(tokenizer.encode(_context_text(tokenizer, head))), context_ids)
        question_ids = [encode(tokenizer, _query_text(tokenizer, q)) for q in context.questions]
        if n_prefix == len(context_ids):
            raise KvbenchError(f"empty context body in {context.bench}/{context.task} item {context.item}")
        truncated_from = None
        if max_length is not None:
            limit = max_length - context.reserve_tokens
            if 0 <= limit < len(context_ids):
                if limit < 2:  # the official cut keeps nothing and then fails its own length check
                    raise KvbenchError(
                        f"{context.bench}/{context.task} item {context.item}: the model limit of {max_length} "
                        f"tokens less the {context.reserve_tokens} the official runner reserves for answers leaves "
                        f"no room for the {len(context_ids)}-token context; use a model with a longer context"
                    )
                truncated_from = len(context_ids)
                context_ids = context_ids[: limit // 2] + context_ids[-(limit // 2) :]
                n_prefix = min(n_prefix, limit // 2)
        return Rendered(context_ids[:n_prefix], context_ids[n_prefix:], question_ids, truncated_from)


#: The instance ``SCBenchBench.assemblies`` names.
ASSEMBLY = SCBenchAssembly()
