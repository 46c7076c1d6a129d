"""Render a :class:`~kvbench.tasks.Context` into token ids through the model's chat template.

The full prompt of question ``j`` is the chat template applied to one user message
``instruction + glue + body + "\\n" + question_j`` with the generation prompt, followed by the question's
answer prefix (``glue`` is the context's, ``"\\n"`` unless the bench says otherwise). It is split the
query-agnostic way into three token-id pieces, tokenized separately (no special tokens added):

* ``prefix_ids``: template header + instruction + glue (the protected prefix, at most 256 protected);
* ``body_ids``: the body (middle-truncated when the whole would exceed the model limit);
* ``question_ids[j]``: "\\n" + question + template tail (end of turn, assistant header) + answer prefix.

Context = prefix + body; every question is appended to the same context. A tokenizer without a chat
template gets the plain concatenation (RULER's "base" template), with one space between the question
and a non-empty answer prefix, as RULER writes ``"...text? The special magic..."``.

:func:`prompt_length` counts the whole prompt text tokenized in one piece, as RULER's scripts count
``input + answer_prefix``; with a BPE tokenizer that can differ by a token or two from the sum of the
three pieces above (a byte-level tokenizer gives the same count either way).

**SCBench's assembly** (``context.assembly == "scbench"``), as ``create_scdq_prompt`` and ``run_scbench.py``
of microsoft/MInference build a shared-context multi-query prompt, token for token:

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

from dataclasses import dataclass

from kvbench.budgets import protected_length
from kvbench.engines.base import context_sha256
from kvbench.errors import KvbenchError
from kvbench.tasks import Context

_BODY = "\x00KVBENCH_BODY\x00"
_QUESTION = "\x00KVBENCH_QUESTION\x00"


@dataclass(frozen=True)
class Rendered:
    """Token ids of one context and its questions, and how the context was cut."""

    prefix_ids: list[int]
    body_ids: list[int]
    question_ids: list[list[int]]
    truncated_from: int | None  # context length before middle truncation, None if not truncated

    @property
    def context_ids(self) -> list[int]:
        return self.prefix_ids + self.body_ids

    @property
    def prot(self) -> int:
        return protected_length(len(self.prefix_ids), len(self.context_ids))

    @property
    def sha256(self) -> str:
        return context_sha256(self.context_ids)


def template_parts(tokenizer) -> tuple[str, str]:
    """(head, tail) of the chat template around the user content: head + content + tail."""
    if not getattr(tokenizer, "chat_template", None):
        return "", ""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _BODY}], tokenize=False, add_generation_prompt=True
    )
    head, _, tail = text.partition(_BODY)
    if not _:
        raise KvbenchError("the tokenizer's chat template does not place the user content verbatim")
    return head, tail


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens added (``[]`` for empty text)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _question_text(question, tail: str) -> str:
    """What follows the body for one question: "\\n" + question + template tail + answer prefix, with a
    space before a non-empty answer prefix when there is no chat template (RULER's base template)."""
    sep = " " if not tail and question.answer_prefix else ""
    return "\n" + question.text + tail + sep + question.answer_prefix


def prompt_text(tokenizer, context: Context, j: int = 0) -> str:
    """The whole prompt of question ``j`` as one string: what :func:`render`'s pieces encode, joined."""
    if context.assembly == "scbench":
        text = _scbench_context_text(tokenizer, context.instruction + context.glue + context.body)
        return text + _scbench_query_text(tokenizer, context.questions[j])
    head, tail = template_parts(tokenizer)
    return head + context.instruction + context.glue + context.body + _question_text(context.questions[j], tail)


_SCBENCH_SEP = "[SEPSEPSEP]"  # the official scdq delimiter


def _scbench_context_text(tokenizer, text: str) -> str:
    """The official scdq context prompt of user content ``text``: chat head + ``text`` (as the template
    writes it), no end of turn."""
    if not getattr(tokenizer, "chat_template", None):
        return text
    templated = tokenizer.apply_chat_template(
        [{"role": "user", "content": text + _SCBENCH_SEP}], add_generation_prompt=True, tokenize=False
    )
    return templated.split(_SCBENCH_SEP)[0]


def _scbench_query_text(tokenizer, question) -> str:
    """The official scdq query prompt of ``question``: its text + end of turn + assistant header (from a
    ``[system "", user]`` conversation), then the answer prefix."""
    if not getattr(tokenizer, "chat_template", None):
        return question.text + question.answer_prefix
    templated = tokenizer.apply_chat_template(
        [{"role": "system", "content": ""}, {"role": "user", "content": _SCBENCH_SEP + question.text}],
        add_generation_prompt=True,
        tokenize=False,
    )
    return templated.split(_SCBENCH_SEP)[1] + question.answer_prefix


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _render_scbench(tokenizer, context: Context, max_length: int | None) -> Rendered:
    """:func:`render` for SCBench's own assembly (module docstring)."""
    head = context.instruction + context.glue
    context_ids = list(tokenizer.encode(_scbench_context_text(tokenizer, head + context.body)))
    n_prefix = _common_prefix(list(tokenizer.encode(_scbench_context_text(tokenizer, head))), context_ids)
    question_ids = [encode(tokenizer, _scbench_query_text(tokenizer, q)) for q in context.questions]
    if n_prefix == len(context_ids):
        raise KvbenchError(f"empty context body in {context.bench}/{context.task} item {context.item}")
    truncated_from = None
    if max_length is not None:
        limit = max_length - context.reserve_tokens
        if 0 <= limit < len(context_ids):
            if limit < 2:  # the official cut keeps nothing and then fails its own length check
                raise KvbenchError(
                    f"{context.bench}/{context.task} item {context.item}: the model limit of {max_length} tokens "
                    f"less the {context.reserve_tokens} the official runner reserves for answers leaves no room for "
                    f"the {len(context_ids)}-token context; use a model with a longer context"
                )
            truncated_from = len(context_ids)
            context_ids = context_ids[: limit // 2] + context_ids[-(limit // 2) :]
            n_prefix = min(n_prefix, limit // 2)
    return Rendered(context_ids[:n_prefix], context_ids[n_prefix:], question_ids, truncated_from)


def render(tokenizer, context: Context, max_length: int | None = None) -> Rendered:
    """Tokenize ``context`` as described in the module docstring (SCBench's assembly when
    ``context.assembly == "scbench"``).

    max_length: the model/engine limit in tokens. If context + the longest question + its
    ``max_new_tokens`` would exceed it, the body's token ids are middle-truncated (first and last halves
    kept, as SCBench does) and ``truncated_from`` records the original context length.
    """
    if context.assembly == "scbench":
        return _render_scbench(tokenizer, context, max_length)
    head, tail = template_parts(tokenizer)
    prefix_ids = encode(tokenizer, head + context.instruction + context.glue)
    body_ids = encode(tokenizer, context.body)
    question_ids = [encode(tokenizer, _question_text(q, tail)) for q in context.questions]
    if not body_ids:
        raise KvbenchError(f"empty context body in {context.bench}/{context.task} item {context.item}")
    truncated_from = None
    if max_length is not None:
        need = max(
            (len(q) + spec.max_new_tokens for q, spec in zip(question_ids, context.questions, strict=False)), default=0
        )
        room = max_length - len(prefix_ids) - need
        if room < 2:
            raise KvbenchError(
                f"{context.bench}/{context.task} item {context.item}: the instruction and questions alone need "
                f"{max_length - room} of the {max_length} tokens the model allows"
            )
        if len(body_ids) > room:
            truncated_from = len(prefix_ids) + len(body_ids)
            body_ids = body_ids[: room // 2] + body_ids[len(body_ids) - (room - room // 2) :]
    return Rendered(prefix_ids, body_ids, question_ids, truncated_from)


def prompt_length(tokenizer):
    """A ``PromptLength`` for generators: tokens of the whole prompt of the first question
    (:func:`prompt_text`, tokenized in one piece as RULER counts). The returned callable also has
    ``text_tokens(text) -> int``, the token count of raw text (RULER counts its one-shot examples so), and
    ``tokenizer``. A context in SCBench's assembly counts its context prompt and first query as
    :func:`render` encodes them."""

    def length(context: Context) -> int:
        if context.assembly == "scbench":  # its own pieces, each encoded as the official runner does
            rendered = render(tokenizer, context)
            return len(rendered.context_ids) + (len(rendered.question_ids[0]) if context.questions else 0)
        if not context.questions:
            head, _ = template_parts(tokenizer)
            return len(encode(tokenizer, head + context.instruction + context.glue + context.body))
        return len(encode(tokenizer, prompt_text(tokenizer, context)))

    length.text_tokens = lambda text: len(encode(tokenizer, text))
    length.tokenizer = tokenizer
    return length
