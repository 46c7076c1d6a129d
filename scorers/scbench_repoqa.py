"""SCBench repoqa scoring (official ``scbench/repo_qa_utils.py``, after evalplus/repoqa), per item.

A repoqa answer is correct (pass@1 at threshold 0.8) iff, among every *needle* function of the same
repository, the one most similar to the extracted answer is the target function **and** that similarity is
at least 0.8. Steps, as in the official code (``ignore_comments=False``, its default):

1. :func:`sanitize_output`: strip the output; take the triple-backtick fenced blocks (the official
   regex, DOTALL | MULTILINE: a fence line with an optional language tag, up to the next line starting
   with a fence). No block: the stripped output itself. Otherwise the first function that tree-sitter's
   query for the language finds in the first block that has one, else the first block.
2. :func:`function_similarity`: nltk ``sentence_bleu`` of whitespace tokens (``re.split(r"\\s+", s.strip())``)
   with ``SmoothingFunction().method4``.
3. :func:`best_needle`: walk the needles in pool order keeping the first strictly best similarity (start
   0.0, no target); the item passes iff that needle's name is the target name and the similarity >= 0.8.

The needle pool: the official scorer collects it from the prediction file, i.e. every repoqa turn's
``(name, answer)`` of every row with the same ``repo`` in the evaluated rows. kvbench builds it from the
whole task file (independent of ``--limit``), so a subset run scores against the same distractors as a
full run; duplicate ``(name, source)`` pairs are dropped (they cannot change the winner).

**Parser.** The official code uses ``tree_sitter_languages`` (wheels for tree-sitter 0.21.3). kvbench uses
the same pair (``tree_sitter==0.21.3``, ``tree_sitter_languages==1.10.2``). Where they cannot be imported
(e.g. a Python without those wheels), extraction falls back to the first fenced block, i.e. what the
official code returns when tree-sitter finds no function; a ``RuntimeWarning`` says so once per process.
Scores may then differ for answers whose first block holds more than the function.

**References layout** (the Question API has no other channel), see :func:`repoqa_references`::

    (gold_source, lang, target_name, name_1, source_1, name_2, source_2, ...)

the pairs being the repository's needle pool in order (it includes the target).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Sequence
from functools import lru_cache

__all__ = [
    "FUNCTION_QUERY",
    "LANGUAGES",
    "THRESHOLD",
    "best_needle",
    "function_similarity",
    "parse_repoqa_references",
    "parser_available",
    "repoqa_pass",
    "repoqa_references",
    "sanitize_output",
]

#: tree-sitter queries for "a function definition" per language (official ``FUNCTION_QUERY``).
FUNCTION_QUERY = {
    "python": "(function_definition name: (_)) @fdef",
    "java": "(method_declaration name: (_)) @fdef",
    "typescript": "(function_declaration name: (_)) @fdef",
    "rust": "(function_item name: (_)) @fdef",
    "cpp": "(function_definition declarator: (function_declarator declarator: (identifier))) @fdef",
    "go": "(function_declaration name: (_)) @fdef",
}
LANGUAGES = tuple(FUNCTION_QUERY)
THRESHOLD = 0.8  # the reported pass@1 threshold

_FENCE = re.compile(r"^```(?:\w+)?\s*\n(.*?)(?=^```)```", re.DOTALL | re.MULTILINE)
_WS = re.compile(r"\s+")
_warned = False


@lru_cache(maxsize=None)
def _ts(lang: str):
    """(parser, query) for ``lang``, or None when tree_sitter_languages is unavailable."""
    global _warned
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tree_sitter 0.21 deprecation noise from tree_sitter_languages
            from tree_sitter_languages import get_language, get_parser

            return get_parser(lang), get_language(lang).query(FUNCTION_QUERY[lang])
    except ImportError:
        if not _warned:
            _warned = True
            warnings.warn(
                "tree_sitter_languages is not importable: repoqa answers are extracted as the first fenced "
                "block, without the official tree-sitter function extraction "
                "(pip install tree_sitter==0.21.3 tree_sitter_languages==1.10.2)",
                RuntimeWarning,
                stacklevel=3,
            )
        return None


def parser_available() -> bool:
    """True when the official tree-sitter extraction is in use."""
    return _ts("python") is not None


def sanitize_output(model_output: str, lang: str) -> str:
    """The answer's code as the official ``sanitize_output`` extracts it (see the module docstring)."""
    if lang not in FUNCTION_QUERY:
        raise ValueError(f"unknown repoqa language {lang!r}; valid: {', '.join(LANGUAGES)}")
    text = model_output.strip()
    blocks = _FENCE.findall(text)
    if not blocks:
        return text
    ts = _ts(lang)
    if ts is not None:
        parser, query = ts
        for block in blocks:
            data = block.encode("utf8")
            try:
                captures = query.captures(parser.parse(data).root_node)
            except Exception:  # the official code ignores any parser failure for the block
                continue
            if captures:
                node = captures[0][0]
                return data[node.start_byte : node.end_byte].decode("utf8")
    return blocks[0]


def function_similarity(candidate: str, reference: str) -> float:
    """Sentence BLEU (nltk, smoothing method4) of whitespace tokens, in [0, 1]."""
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    cand = _WS.split(candidate.strip())
    ref = _WS.split(reference.strip())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(sentence_bleu([ref], cand, smoothing_function=SmoothingFunction().method4))


def best_needle(model_output: str, lang: str, needles: Iterable[tuple[str, str]]) -> tuple[str | None, float]:
    """(name, similarity) of the first needle with the strictly highest similarity to the extracted
    answer; (None, 0.0) when every similarity is 0."""
    answer = sanitize_output(model_output, lang)
    best_name, best_sim = None, 0.0
    for name, source in needles:
        sim = function_similarity(answer, source)
        if sim > best_sim:
            best_name, best_sim = name, sim
    return best_name, best_sim


def repoqa_pass(
    model_output: str, lang: str, target: str, needles: Iterable[tuple[str, str]], threshold: float = THRESHOLD
) -> bool:
    """Official pass@1 at ``threshold`` for one answer (with one sample, pass@1 is 0 or 1)."""
    name, sim = best_needle(model_output, lang, needles)
    return name == target and sim >= threshold


def repoqa_references(gold: str, lang: str, name: str, needles: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """Pack a repoqa question's references: ``(gold, lang, name, n1, s1, n2, s2, ...)``."""
    if lang not in FUNCTION_QUERY:
        raise ValueError(f"unknown repoqa language {lang!r}; valid: {', '.join(LANGUAGES)}")
    flat: list[str] = []
    for n, s in needles:
        flat += [n, s]
    return (gold, lang, name, *flat)


def parse_repoqa_references(references: Sequence[str]) -> tuple[str, str, str, list[tuple[str, str]]]:
    """Unpack :func:`repoqa_references`: ``(gold, lang, name, needles)``; malformed raises ``ValueError``."""
    if isinstance(references, str) or len(references) < 3 or (len(references) - 3) % 2:
        raise ValueError(
            "repoqa references must be (gold_source, lang, target_name, name_1, source_1, ...), got "
            f"{len(references) if not isinstance(references, str) else 'a string'} items"
        )
    gold, lang, name = references[0], references[1], references[2]
    if lang not in FUNCTION_QUERY:
        raise ValueError(f"unknown repoqa language {lang!r} in references; valid: {', '.join(LANGUAGES)}")
    rest = list(references[3:])
    return gold, lang, name, list(zip(rest[0::2], rest[1::2], strict=True))
