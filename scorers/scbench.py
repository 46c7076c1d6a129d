"""SCBench scorers, per item, 0–100: the official ones (``microsoft/MInference`` ``scbench/compute_scores.py``
with labels from ``eval_utils.get_ground_truth``) and the documented revisions.

Every SCBench question carries two scorer names, ``(official, revised)``, so each result row stores both.
Names are ``scbench_<task>`` / ``scbench_<task>_revised``; the two mixed tasks are scored per sub-task,
``scbench_summary_with_needles_{summary,passkey}`` and ``scbench_repoqa_and_kv_{repoqa,kv}`` (+ ``_revised``).
Where no revision exists the revised name is the same function as the official one.

Official metric per task (labels as ``get_ground_truth`` builds them from the row):

* ``kv``, ``prefix_suffix``: ``label in prediction`` (case-sensitive substring).
* ``vt``: ``string_match_all``: fraction of the references found in the prediction (lower-cased), rounded to
  2 decimals per item as the official function does.
* ``qa_eng``: label ``[answer]``; any reference, upper-cased, is a substring of the upper-cased stripped
  prediction (not F1).
* ``qa_chn``: ``qa_f1_score_zh`` over the raw answer *string*, so each character is a separate reference:
  ``2 / (len(norm_pred) + 1)`` when any answer character occurs in the normalised prediction (bug a).
* ``choice_eng``: label ``[option_text, letter]``; the first character of the stripped prediction decides
  whenever it is one of ``ABCD`` (bug b), then the official fallbacks (exact label, "answer is"/"answer:"/
  "option is" prefixes, first word that is a substring of ``"ABCD"``).
* ``many_shot``: ``for item in label: if item.upper() in pred.upper()`` over the raw answer string, i.e.
  character by character, as the official code does (``get_ground_truth`` passes the str). Kept as is: the
  paper revises only ``qa_chn`` and ``choice_eng``.
* ``summary``: ``evaluate``'s rouge ``rougeLsum`` F-measure, computed offline with ``rouge_score``
  (``RougeScorer(["rougeLsum"], use_stemmer=False).score(reference, prediction)``), which is what
  ``evaluate.load("rouge")`` runs.
* ``mf``: the first ``\\d+\\.\\d+|\\d+`` in the prediction, ``int(float(x)) == label`` (``float(x) == label``
  for a non-integer label).
* ``repoqa``: :mod:`kvbench.scorers.scbench_repoqa` (pass@1 at BLEU >= 0.8 among the repo's needles).
* ``summary_with_needles``: ``summary`` turns as ``summary``; ``passkey`` turns: the label equals the first
  run of digits in the prediction.
* ``repoqa_and_kv``: ``repoqa`` turns as ``repoqa``; ``kv`` turns: **always 0** officially (bug c: in
  shared-context mode ``compute_scores.py`` passes the prediction *dicts*, so ``label in dict`` tests the
  dict's keys).

Revisions (``*_revised``):

* ``qa_chn``: normalise the prediction and every *complete* reference (lower case, punctuation and
  whitespace removed, the official ``normalize_zh_answer``) and take the maximum character-level F1.
* ``choice_eng``: only an explicit option counts, read from the first non-empty line of the stripped
  prediction with ``**`` removed (see :func:`resolve_choice`): ``B``, ``B.``, ``B)``, ``B:``, ``(B)``,
  ``B. <option text>`` (also ``B) ``, ``B: ``, ``(B) ``), ``Option B`` and ``Answer: B`` (each optionally
  followed by the option's own text). Anything else, the option text alone and "Based on ..." included,
  is unresolved and scores 0.
* ``repoqa_and_kv`` kv half: ``label in prediction`` on the prediction text (as ``kv``).

References layouts (the Question API has only the references tuple):

* ``choice_eng``: ``(answer_text, option_A, option_B, option_C, option_D)``.
* ``mf``: ``(str(label),)``; ``repoqa`` and the repoqa half of ``repoqa_and_kv``: see
  :func:`kvbench.scorers.scbench_repoqa.repoqa_references`.
* every other task: the answer(s) as strings (``vt``: one per variable name).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from functools import lru_cache

from kvbench.scorers import register_scorer
from kvbench.scorers.scbench_repoqa import parse_repoqa_references, repoqa_pass

__all__ = [
    "SCORER_NAMES",
    "choice_references",
    "normalize_zh_answer",
    "resolve_choice",
    "scorer_names",
]

OPTIONS = "ABCD"
_CN_PUNCT = (
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿"
    "–—‘’‛“”„‟…‧﹏."
)
_ZH_PUNCT = frozenset(string.punctuation + _CN_PUNCT)


def _check(references: Sequence[str], n: int = 1) -> None:
    if isinstance(references, str) or len(references) < n:
        raise ValueError(f"references must be a sequence of at least {n} strings, got {references!r}")


def _pct(x: float | bool) -> float:
    return 100.0 * float(x)


# --- shared pieces of the official code ------------------------------------------------------------------


def normalize_zh_answer(text: str) -> str:
    """Official ``normalize_zh_answer``: lower case, drop ASCII and Chinese punctuation, drop whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _ZH_PUNCT)
    return "".join(text.split())


def _f1(pred_tokens: Sequence[str], label_tokens: Sequence[str]) -> float:
    same = sum((Counter(pred_tokens) & Counter(label_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(label_tokens)
    return 2 * precision * recall / (precision + recall)


def _first_int_run(prediction: str) -> str:
    """Official ``first_int_match``: the first non-empty piece of ``re.split("[^0-9]", prediction)``."""
    for piece in re.split("[^0-9]", prediction):
        if piece:
            return piece
    return ""


def _kv(prediction: str, references: Sequence[str]) -> float:
    _check(references)
    return _pct(references[0] in prediction)


# --- official scorers ------------------------------------------------------------------------------------


def kv_official(prediction: str, references: Sequence[str]) -> float:
    """kv / prefix_suffix: 100 if the label is a (case-sensitive) substring of the prediction."""
    return _kv(prediction, references)


def vt_official(prediction: str, references: Sequence[str]) -> float:
    """vt: ``string_match_all`` with the official per-item rounding to 2 decimals."""
    _check(references)
    pred = prediction.lower()
    frac = sum(1.0 if r.lower() in pred else 0.0 for r in references) / len(references)
    return _pct(round(frac, 2))


def qa_eng_official(prediction: str, references: Sequence[str]) -> float:
    """qa_eng: any upper-cased reference is a substring of the stripped, upper-cased prediction."""
    _check(references)
    pred = prediction.strip().upper()
    return _pct(any(r.upper() in pred for r in references))


def qa_chn_official(prediction: str, references: Sequence[str]) -> float:
    """qa_chn, official (bug a): every *character* of each reference string is its own reference."""
    _check(references)
    pred = list(normalize_zh_answer(prediction))
    return _pct(max((_f1(pred, list(normalize_zh_answer(ch))) for r in references for ch in r), default=0.0))


def qa_chn_revised(prediction: str, references: Sequence[str]) -> float:
    """qa_chn, revised: maximum character-level F1 over the complete normalised references."""
    _check(references)
    pred = list(normalize_zh_answer(prediction))
    return _pct(max(_f1(pred, list(normalize_zh_answer(r))) for r in references))


def choice_references(answer: str, options: Sequence[str]) -> tuple[str, ...]:
    """References of a choice_eng question: ``(answer_text, A, B, C, D)``."""
    if len(options) != 4 or answer not in options:
        raise ValueError(f"choice_eng needs 4 options containing the answer; got {list(options)!r} / {answer!r}")
    return (answer, *options)


def _choice_label(references: Sequence[str]) -> tuple[str, list[str]]:
    if isinstance(references, str) or len(references) != 5 or references[0] not in references[1:]:
        raise ValueError(
            "choice_eng references must be (answer_text, option_A, option_B, option_C, option_D) with the "
            f"answer among the options, got {references!r}"
        )
    answer, options = references[0], list(references[1:])
    return OPTIONS[options.index(answer)], options


def choice_eng_official(prediction: str, references: Sequence[str]) -> float:
    """choice_eng, official ``get_score_one_longbook_choice_eng`` with label ``[answer_text, letter]``."""
    letter, _ = _choice_label(references)
    label = [references[0], letter]
    pred = prediction.strip()
    if pred == "":
        return 0.0
    if pred[0] in OPTIONS:  # bug b: "Based on ..." reads as B
        return _pct(pred[0] in label)
    if pred in label:
        return 100.0
    for c in ["\n", '"', "'", ".", ",", "?", "!", "{", "}"]:
        pred = pred.replace(c, " ")
    while "  " in pred:
        pred = pred.replace("  ", " ")
    for prefix in ["answer is:", "answer:", "answer is", "option is"]:
        idx = pred.find(prefix)
        if idx == -1:
            continue
        if len(pred) < idx + len(prefix) + 1:
            return 0.0
        after = pred[idx + len(prefix) + 1 :]
        return _pct(any(after.startswith(s) for s in label))
    for word in pred.split():
        if word in OPTIONS:  # substring test, as in the official code ("AB" counts)
            return _pct(word in label)
    return 0.0


def _norm_option(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(" .;:,!")


_CHOICE = re.compile(
    r"^(?:(?:option|answer\s*:)\s*)?"  # optional "Option" / "Answer:" (case-insensitive)
    r"(?:\((?P<l1>[A-D])\)|(?P<l2>[A-D])(?=[.):\s]|$))"  # (B) or B followed by . ) : space or end
    r"[.):]?(?P<rest>.*)$",
    re.IGNORECASE,
)


def resolve_choice(prediction: str, options: Sequence[str]) -> str | None:
    """The explicitly chosen option letter of ``prediction``, or None (unresolved).

    Read from the first non-empty line of the stripped prediction, ``**`` removed. Accepted: an upper-case
    letter ``A``–``D`` alone, followed by ``.``, ``)`` or ``:``, or in parentheses (``B``, ``B.``, ``B)``,
    ``B:``, ``(B)``), optionally prefixed by ``Option`` or ``Answer:`` (case-insensitive); after it nothing
    but punctuation, or the text of that same option (``B. Beta``, ``B Beta``, ``Option B: Beta``; the line
    may go on after the option text at a non-alphanumeric character: ``B. Beta, because ...``). Anything
    else (the option text alone, "Based on ...", "The answer is B", another option's text after the
    letter) is unresolved.
    """
    text = prediction.replace("**", "").strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    m = _CHOICE.match(line)
    if m is None:
        return None
    letter = m.group("l1") or m.group("l2")
    if letter not in OPTIONS:  # IGNORECASE is for the keywords only: "b" is not an explicit option
        return None
    rest = m.group("rest").strip()
    if rest.strip(" .;:,!") == "":
        return letter
    want = _norm_option(options[OPTIONS.index(letter)])
    got = " ".join(rest.lower().split())
    if want and got.startswith(want) and (len(got) == len(want) or not got[len(want)].isalnum()):
        return letter
    return None


def choice_eng_revised(prediction: str, references: Sequence[str]) -> float:
    """choice_eng, revised: 100 iff :func:`resolve_choice` finds an explicit option and it is the gold one."""
    letter, options = _choice_label(references)
    return _pct(resolve_choice(prediction, options) == letter)


def many_shot_official(prediction: str, references: Sequence[str]) -> float:
    """many_shot: ``get_score_one_longdialogue_qa_eng`` over the raw answer string, character by character."""
    _check(references)
    pred = prediction.strip().upper()
    return _pct(any(ch.upper() in pred for ch in references[0]))


@lru_cache(maxsize=1)
def _rouge():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=False)


def summary_official(prediction: str, references: Sequence[str]) -> float:
    """summary: rougeLsum F-measure (``evaluate``'s rouge with ``use_aggregator=False``), x100."""
    _check(references)
    return _pct(_rouge().score(references[0], prediction)["rougeLsum"].fmeasure)


_NUM = re.compile(r"\d+\.\d+|\d+")


def mf_official(prediction: str, references: Sequence[str]) -> float:
    """mf: the first number of the prediction equals the label (``int(float(x))`` for an int label)."""
    _check(references)
    label_text = references[0].strip()
    m = _NUM.search(prediction)
    if m is None:
        return 0.0
    try:
        label: int | float = int(label_text)
    except ValueError:
        label = float(label_text)
        return _pct(float(m.group(0)) == label)
    try:
        return _pct(int(float(m.group(0))) == label)
    except OverflowError:  # a digit run beyond float range (the official code would raise)
        return 0.0


def repoqa_official(prediction: str, references: Sequence[str]) -> float:
    """repoqa: pass@1 at BLEU >= 0.8 against the repo's needle pool packed in ``references``."""
    _, lang, name, needles = parse_repoqa_references(references)
    return _pct(repoqa_pass(prediction, lang, name, needles))


def passkey_official(prediction: str, references: Sequence[str]) -> float:
    """summary_with_needles passkey turns: the label equals the first run of digits in the prediction."""
    _check(references)
    return _pct(references[0] == _first_int_run(prediction))


def kv_in_repoqa_and_kv_official(prediction: str, references: Sequence[str]) -> float:
    """repoqa_and_kv kv turns, official shared-context mode: always 0 (bug c)."""
    _check(references)
    return 0.0


# --- registry --------------------------------------------------------------------------------------------

#: (official, revised) scorer functions per scorer key: a task, or ``<task>_<subtask>`` for mixed tasks.
_TABLE: dict[str, tuple[Callable[[str, Sequence[str]], float], Callable[[str, Sequence[str]], float]]] = {
    "kv": (kv_official, kv_official),
    "prefix_suffix": (kv_official, kv_official),
    "vt": (vt_official, vt_official),
    "repoqa": (repoqa_official, repoqa_official),
    "qa_eng": (qa_eng_official, qa_eng_official),
    "qa_chn": (qa_chn_official, qa_chn_revised),
    "choice_eng": (choice_eng_official, choice_eng_revised),
    "many_shot": (many_shot_official, many_shot_official),
    "summary": (summary_official, summary_official),
    "mf": (mf_official, mf_official),
    "summary_with_needles_summary": (summary_official, summary_official),
    "summary_with_needles_passkey": (passkey_official, passkey_official),
    "repoqa_and_kv_repoqa": (repoqa_official, repoqa_official),
    "repoqa_and_kv_kv": (kv_in_repoqa_and_kv_official, kv_official),
}


def scorer_names(key: str) -> tuple[str, str]:
    """``("scbench_<key>", "scbench_<key>_revised")`` for a task or ``<task>_<subtask>`` key."""
    if key not in _TABLE:
        raise KeyError(f"no SCBench scorer for {key!r}; valid: {', '.join(_TABLE)}")
    return f"scbench_{key}", f"scbench_{key}_revised"


#: Every registered SCBench scorer name, official and revised.
SCORER_NAMES: tuple[str, ...] = tuple(n for key in _TABLE for n in scorer_names(key))

for _key, (_official, _revised) in _TABLE.items():
    _o, _r = scorer_names(_key)
    register_scorer(_o)(_official)
    register_scorer(_r)(_revised)
