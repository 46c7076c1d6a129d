"""SCBench scorers: official ones (with their three bugs) and the revisions, on hand-worked cases, plus
fuzzing of every scorer on arbitrary text."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.scorers import get_scorer, list_scorers, score
from kvbench.scorers import scbench as sc
from kvbench.scorers import scbench_repoqa as rq

FIXTURES = Path(__file__).parent / "fixtures" / "scbench"


def both(key: str, prediction: str, references) -> tuple[float, float]:
    official, revised = sc.scorer_names(key)
    return score(official, prediction, references), score(revised, prediction, references)


def _row(task: str) -> dict:
    (row,) = pq.read_table(FIXTURES / f"scbench_{task}" / "test-00000-of-00001.parquet").to_pylist()
    return row


_REPO = _row("repoqa")["multi_turns"]
CLAMP, MEAN = _REPO[0]["answer"], _REPO[1]["answer"]
NEEDLES = [("clamp", CLAMP), ("running_mean", MEAN)]
MEAN_REFS = rq.repoqa_references(MEAN, "python", "running_mean", NEEDLES)
CHOICE = sc.choice_references("Beta", ["Alpha", "Beta", "Gamma", "Delta"])  # gold: B


#: the official extraction needs tree_sitter==0.21.3 + tree_sitter_languages (no wheels for Python 3.13)
needs_tree_sitter = pytest.mark.skipif(not rq.parser_available(), reason="tree_sitter_languages not installed")


def fence(code: str, lang: str = "python") -> str:
    return f"```{lang}\n{code}\n```"


# --- registry ----------------------------------------------------------------------------------------------


def test_all_names_registered_in_pairs():
    names = set(list_scorers())
    assert set(sc.SCORER_NAMES) <= names
    assert len(sc.SCORER_NAMES) == 28  # 10 single tasks + 4 sub-tasks, official + revised
    for key in ("kv", "qa_chn", "choice_eng", "summary_with_needles_passkey", "repoqa_and_kv_kv"):
        assert sc.scorer_names(key) == (f"scbench_{key}", f"scbench_{key}_revised")
    with pytest.raises(KeyError):
        sc.scorer_names("summary_with_needles")  # mixed tasks are scored per sub-task only


def test_only_the_three_documented_revisions_differ():
    differ = {k for k in sc._TABLE if sc._TABLE[k][0] is not sc._TABLE[k][1]}
    assert differ == {"qa_chn", "choice_eng", "repoqa_and_kv_kv"}


# --- kv, prefix_suffix, vt, qa_eng, many_shot ---------------------------------------------------------------


@pytest.mark.parametrize("key", ["kv", "prefix_suffix"])
def test_kv_substring_case_sensitive(key):
    refs = ("b8e2d4f6-1a3c",)
    assert both(key, "The value is b8e2d4f6-1a3c.", refs) == (100.0, 100.0)
    assert both(key, "The value is B8E2D4F6-1A3C.", refs) == (0.0, 0.0)
    assert both(key, "b8e2d4f6", refs) == (0.0, 0.0)


def test_vt_fraction_rounded_per_item():
    refs = ("QXHVE", "ZLPRA", "MKTUW")
    assert both("vt", "qxhve, ZLPRA", refs) == (67.0, 67.0)  # round(2/3, 2) = 0.67
    assert both("vt", "QXHVE ZLPRA MKTUW", refs) == (100.0, 100.0)
    assert both("vt", "none", refs) == (0.0, 0.0)


def test_qa_eng_uppercase_substring_not_f1():
    refs = ("the Wren",)
    assert both("qa_eng", "  The Wren.  ", refs) == (100.0, 100.0)
    assert both("qa_eng", "Wren", refs) == (0.0, 0.0)  # a substring of the reference is not enough
    assert both("qa_eng", "x", ("nope", "X")) == (100.0, 100.0)  # any reference


def test_many_shot_character_loop_is_kept():
    # The official loop runs over the answer *string*: any of "(", "A", ")" in the prediction scores 100.
    refs = ("(A)",)
    assert both("many_shot", "(A)", refs) == (100.0, 100.0)
    assert both("many_shot", "(B)", refs) == (100.0, 100.0)  # "(" matches: the official behaviour
    assert both("many_shot", "b", refs) == (0.0, 0.0)
    assert both("many_shot", "a", refs) == (100.0, 100.0)  # upper-cased on both sides


# --- qa_chn: bug (a) ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prediction, official, revised",
    [
        ("北京大学", 2 / 5, 1.0),  # official: each answer char is a reference: 2 / (len(pred) + 1)
        ("北", 1.0, 0.4),  # one shared char wins officially; revised: P=1, R=1/4
        ("答案是北京大学。", 2 / 8, 8 / 11),  # normalised pred has 7 chars; revised P=4/7, R=1
        ("北京", 2 / 3, 2 / 3),  # P=1, R=1/2 happens to equal 2/(2+1)
        ("上海", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_qa_chn_official_vs_revised(prediction, official, revised):
    o, r = both("qa_chn", prediction, ("北京大学",))
    assert o == pytest.approx(100 * official)
    assert r == pytest.approx(100 * revised)


def test_qa_chn_f1_counts_repeated_characters():
    """Character F1 counts a character as often as both sides have it (a multiset intersection, as the official
    ``Counter(a) & Counter(b)``): prediction 北北京 against 北北京大学 shares 3 characters, P = 3/3, R = 3/5,
    F1 = 0.75 (a set intersection would share 2: P = 2/3, R = 2/5, F1 = 0.5)."""
    assert both("qa_chn", "北北京", ("北北京大学",))[1] == pytest.approx(75.0)


def test_qa_chn_normalises_the_references_too():
    """The references go through normalize_zh_answer like the prediction: punctuation, spaces and case in a
    reference do not count (revised: the whole reference; official: each of its characters)."""
    assert both("qa_chn", "北京大学", ("北京，大学",))[1] == 100.0
    assert both("qa_chn", "ab", ("A B",))[1] == 100.0
    assert both("qa_chn", "a", ("A",))[0] == 100.0  # official: the reference character "A" reads as "a"


def test_qa_chn_normalisation_and_max_over_complete_references():
    assert sc.normalize_zh_answer(" 北京，大学！ AB ") == "北京大学ab"
    # revised: punctuation/whitespace/case do not matter, best complete reference wins
    assert both("qa_chn", "北京 大学。", ("杭州", "北京大学"))[1] == 100.0
    assert both("qa_chn", "ABC", ("abc",))[1] == 100.0
    # official: a punctuation character of the answer normalises to "" and never matches
    assert both("qa_chn", "，", ("北京，大学",))[0] == 0.0


# --- choice_eng: bug (b) -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prediction, official, revised",
    [
        ("Based on the passage, the lighthouse is on Gamma.", 100.0, 0.0),  # "B" of "Based" reads as B
        ("B", 100.0, 100.0),
        ("B.", 100.0, 100.0),
        ("B. Beta", 100.0, 100.0),
        ("B) Beta, as the first chapter says", 100.0, 100.0),
        ("(B)", 0.0, 100.0),  # official: no fallback reads "(B)"
        ("(B) Beta", 0.0, 100.0),
        ("**B**", 0.0, 100.0),
        ("Option B", 100.0, 100.0),  # official: the word "B" fallback
        ("Answer: B", 0.0, 100.0),  # official: reads the "A" of "Answer"
        ("The correct answer is B.", 100.0, 0.0),  # official "answer is" prefix; not an explicit form
        ("Beta", 100.0, 0.0),  # the option text alone: official exact-label match; revised unresolved
        ("B. Gamma", 100.0, 0.0),  # letter contradicted by another option's text
        ("Certainly! It is B.", 0.0, 0.0),  # "C"
        ("According to the text, B", 0.0, 0.0),  # "A"
        ("b", 0.0, 0.0),
        ("C", 0.0, 0.0),
        ("C. Gamma", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_choice_eng_official_vs_revised(prediction, official, revised):
    assert both("choice_eng", prediction, CHOICE) == (official, revised)


def test_resolve_choice_forms():
    opts = ["Alpha", "Beta", "Gamma", "Delta"]
    for text in [
        "D",
        "D.",
        "D)",
        "D:",
        "(D)",
        "(D).",
        "D. Delta",
        "D: Delta.",
        "Option D",
        "option (D)",
        "Option D: Delta",
        "Answer: D",
        "answer: (D)",
        "Answer: D. Delta",
        "\n\n D \nbecause",
    ]:
        assert sc.resolve_choice(text, opts) == "D", text
    for text in ["Delta", "Dear reader", "D Gamma", "The answer is D", "It is D.", "Options: D", "AD", "d.", ""]:
        assert sc.resolve_choice(text, opts) is None, text


def test_resolve_choice_punctuation_and_option_text_edges():
    """Only punctuation after the letter (any of ``.;:,!``, repeated) resolves; other text must be the letter's own
    option, compared without its trailing punctuation and up to a non-alphanumeric character."""
    opts = ["Alpha.", "Max", "Gamma", "Delta"]
    for text, want in [
        ("B..", "B"), ("(B);", "B"), ("B. ,", "B"), ("B!", None),  # punctuation after the letter (not "!" first)
        ("A. Alpha", "A"), ("A. Alpha.", "A"), ("A) alpha, I think", "A"),  # option "Alpha." read without its "."
        ("B. Max", "B"), ("B: max!", "B"),  # an option ending in "x" keeps it ("Ma" is not the option)
        ("B. Maxim", None), ("B X", None), ("B. Ma", None), ("A. Alphabet", None),
    ]:  # fmt: skip
        assert sc.resolve_choice(text, opts) == want, text


def test_choice_references_validated():
    with pytest.raises(ValueError):
        sc.choice_references("Zeta", ["Alpha", "Beta", "Gamma", "Delta"])
    with pytest.raises(ValueError):
        score("scbench_choice_eng", "B", ("Beta", "Alpha", "Beta"))


# --- summary, mf, passkey ----------------------------------------------------------------------------------


def test_summary_rouge_lsum():
    assert both("summary", "the cat sat", ("the cat sat on the mat",))[0] == pytest.approx(200 / 3)  # P=1, R=1/2
    # rougeLsum matches per newline-separated sentence: swapped sentences still score 100 (rougeL: 50)
    assert both("summary", "c d\na b", ("a b\nc d",)) == (100.0, 100.0)
    assert both("summary", "", ("a b",)) == (0.0, 0.0)
    assert both("summary_with_needles_summary", "c d\na b", ("a b\nc d",)) == (100.0, 100.0)


@pytest.mark.parametrize(
    "prediction, label, expected",
    [
        ("88", "88", 100.0),
        ("The answer is 88.0", "88", 100.0),  # int(float("88.0"))
        ("88.9", "88", 100.0),  # truncated, as the official int(float(x))
        ("-88", "88", 100.0),  # no sign in the official regex
        ("8 8", "88", 0.0),
        ("none", "88", 0.0),
        ("2.5", "2.5", 100.0),  # a float label compares as float
        ("2.50", "2.5", 100.0),
        ("2", "2.5", 0.0),
        ("9" * 400, "88", 0.0),  # beyond float range
    ],
)
def test_mf_first_number(prediction, label, expected):
    assert both("mf", prediction, (label,)) == (expected, expected)


def test_passkey_first_digit_run():
    refs = ("71432",)
    key = "summary_with_needles_passkey"
    assert both(key, "The pass key is 71432.", refs) == (100.0, 100.0)
    assert both(key, "71432, not 12345", refs) == (100.0, 100.0)
    assert both(key, "It is 7-1432", refs) == (0.0, 0.0)
    assert both(key, "071432", refs) == (0.0, 0.0)
    assert both(key, "no digits", refs) == (0.0, 0.0)


# --- repoqa and repoqa_and_kv: bug (c) ----------------------------------------------------------------------


def test_repoqa_pass_at_bleu_08():
    assert both("repoqa", fence(MEAN), MEAN_REFS) == (100.0, 100.0)
    assert both("repoqa", MEAN, MEAN_REFS) == (100.0, 100.0)  # no fence: the raw output
    assert both("repoqa", fence(CLAMP), MEAN_REFS) == (0.0, 0.0)  # best needle is clamp
    # the right needle but BLEU below 0.8: renaming a variable costs too much
    name, sim = rq.best_needle(fence(MEAN.replace("total", "acc")), "python", NEEDLES)
    assert name == "running_mean" and sim < 0.8
    assert both("repoqa", fence(MEAN.replace("total", "acc")), MEAN_REFS) == (0.0, 0.0)
    assert both("repoqa", "", MEAN_REFS) == (0.0, 0.0)
    assert both("repoqa_and_kv_repoqa", fence(MEAN), MEAN_REFS) == (100.0, 100.0)


@needs_tree_sitter
def test_repoqa_tree_sitter_extraction():
    # the first function tree-sitter finds in the first block that has one
    block = fence("import math\n\n" + CLAMP + "\n\n" + MEAN)
    assert rq.sanitize_output(block, "python") == CLAMP
    assert both("repoqa", block, MEAN_REFS) == (0.0, 0.0)
    two_blocks = "Here:\n```\nprint(1)\n```\nand\n" + fence(MEAN)
    assert rq.sanitize_output(two_blocks, "python") == MEAN
    assert rq.sanitize_output("```\nprint(1)\n```", "python") == "print(1)\n"  # no function: first block
    assert rq.sanitize_output("  plain text  ", "python") == "plain text"
    assert rq.sanitize_output(fence("func Add(a int, b int) int {\n\treturn a + b\n}", "go"), "go").startswith(
        "func Add"
    )


def test_repoqa_fallback_without_tree_sitter(monkeypatch):
    monkeypatch.setattr(rq, "_ts", lambda lang: None)
    block = fence("import math\n\n" + CLAMP)
    assert rq.sanitize_output(block, "python") == "import math\n\n" + CLAMP + "\n"  # the whole first block


def test_repoqa_ties_keep_the_first_needle():
    twins = [("first", MEAN), ("second", MEAN)]
    assert score("scbench_repoqa", fence(MEAN), rq.repoqa_references(MEAN, "python", "first", twins)) == 100.0
    assert score("scbench_repoqa", fence(MEAN), rq.repoqa_references(MEAN, "python", "second", twins)) == 0.0


def test_repoqa_references_round_trip_and_validation():
    assert rq.parse_repoqa_references(MEAN_REFS) == (MEAN, "python", "running_mean", NEEDLES)
    with pytest.raises(ValueError):
        rq.parse_repoqa_references(MEAN_REFS[:-1])  # odd number of pair items
    with pytest.raises(ValueError):
        rq.repoqa_references(MEAN, "cobol", "x", NEEDLES)
    with pytest.raises(ValueError):
        score("scbench_repoqa", "x", (MEAN, "cobol", "x"))


def test_repoqa_references_validation_edges_and_messages():
    """The smallest valid layout is gold, lang and name with no needles; each malformed one names itself."""
    assert rq.parse_repoqa_references((MEAN, "python", "x")) == (MEAN, "python", "x", [])
    with pytest.raises(ValueError, match=r"target_name, name_1, source_1, \.\.\.\), got 2 items$"):
        rq.parse_repoqa_references((MEAN, "python"))
    with pytest.raises(ValueError, match=r"got 1 items$"):
        rq.parse_repoqa_references((MEAN,))
    with pytest.raises(ValueError, match=r"got 4 items$"):
        rq.parse_repoqa_references((MEAN, "python", "x", "lonely_name"))
    with pytest.raises(ValueError, match=r"got a string items$"):
        rq.parse_repoqa_references("gold python name")
    valid = "valid: python, java, typescript, rust, cpp, go"
    with pytest.raises(ValueError, match=f"unknown repoqa language 'cobol' in references; {valid}$"):
        rq.parse_repoqa_references((MEAN, "cobol", "x"))
    with pytest.raises(ValueError, match=f"unknown repoqa language 'cobol'; {valid}$"):
        rq.repoqa_references(MEAN, "cobol", "x", NEEDLES)
    with pytest.raises(ValueError, match=f"unknown repoqa language 'cobol'; {valid}$"):
        rq.sanitize_output("x", "cobol")


def test_function_similarity_hand_worked_smoothing():
    """'a b c x' against 'a b c d': n-gram precisions 3/4, 2/3, 1/2 and 0/1; nltk's method4 replaces the zero
    by 1 / (2 * 5 / ln 4) (k = 5, hypothesis length 4), brevity penalty 1, so BLEU = the precisions' geometric
    mean. Without smoothing it would be 0."""
    expected = (3 / 4 * 2 / 3 * 1 / 2 * (math.log(4) / 10)) ** 0.25
    assert rq.function_similarity("a b c x", "  a   b\nc d ") == pytest.approx(expected, rel=1e-12)
    assert rq.function_similarity("alpha beta gamma delta", "alpha beta gamma delta") == 1.0


def test_repoqa_pass_threshold_is_inclusive():
    assert rq.repoqa_pass(fence(MEAN), "python", "running_mean", NEEDLES, threshold=1.0)  # similarity exactly 1.0
    assert not rq.repoqa_pass(fence(MEAN), "python", "running_mean", NEEDLES, threshold=1.0 + 1e-12)


def test_parser_available_says_whether_tree_sitter_is_used(monkeypatch):
    assert rq.parser_available() == (importlib.util.find_spec("tree_sitter_languages") is not None)
    monkeypatch.setattr(rq, "_ts", lambda lang: None)
    assert not rq.parser_available()


def test_a_block_the_parser_fails_on_is_skipped(monkeypatch):
    """As in the official code, a parser failure on one block moves on to the next block (it does not stop)."""

    class Node:
        def __init__(self, data: bytes):
            self.start_byte, self.end_byte, self.data = 0, len(data), data

    class Parser:
        def parse(self, data: bytes):
            return type("Tree", (), {"root_node": Node(data)})()

    class Query:
        def captures(self, root: Node):
            if root.data.startswith(b"broken"):
                raise RuntimeError("parser failure")
            return [(root, "fdef")]

    monkeypatch.setattr(rq, "_ts", lambda lang: (Parser(), Query()))
    output = "```\nbroken (\n```\nthen\n```\ndef ok(): pass\n```"
    assert rq.sanitize_output(output, "python") == "def ok(): pass\n"


def test_repoqa_and_kv_kv_half_official_always_zero():
    refs = ("feedface-8888",)
    assert both("repoqa_and_kv_kv", "The value is feedface-8888.", refs) == (0.0, 100.0)
    assert both("repoqa_and_kv_kv", "nothing", refs) == (0.0, 0.0)


# --- fuzzing -----------------------------------------------------------------------------------------------

_TEXT = st.text(max_size=200)
_PRED = st.one_of(
    _TEXT,
    _TEXT.map(lambda s: "```python\n" + s + "\n```"),
    st.sampled_from(["B", "(C)", "Answer: D", "Option A: Alpha", "北京", "88.5", "71432"]).flatmap(
        lambda s: _TEXT.map(lambda t: s + t)
    ),
)
#: references that fit each scorer key (the repoqa ones use the fixture's needles)
_REFS = {
    "choice_eng": CHOICE,
    "repoqa": MEAN_REFS,
    "repoqa_and_kv_repoqa": MEAN_REFS,
    "mf": ("88",),
}


@pytest.mark.parametrize("name", sc.SCORER_NAMES)
@settings(max_examples=40, deadline=None)
@given(prediction=_PRED, ref=st.text(min_size=1, max_size=40))
def test_fuzz_every_scorer_in_range(name, prediction, ref):
    key = name.removeprefix("scbench_").removesuffix("_revised")
    refs = _REFS.get(key, (ref,))
    value = get_scorer(name)(prediction, refs)
    assert isinstance(value, float)
    assert 0.0 <= value <= 100.0


@settings(max_examples=60, deadline=None)
@given(
    prediction=_PRED,
    refs=st.lists(st.text(max_size=30), min_size=1, max_size=4),
)
def test_fuzz_text_references(prediction, refs):
    for key in ("kv", "vt", "qa_eng", "qa_chn", "many_shot", "summary", "summary_with_needles_passkey"):
        for value in both(key, prediction, tuple(refs)):
            assert 0.0 <= value <= 100.0


@settings(max_examples=60, deadline=None)
@given(
    prediction=_PRED,
    options=st.lists(st.text(max_size=20), min_size=4, max_size=4, unique=True),
    gold=st.integers(0, 3),
)
def test_fuzz_choice_any_options(prediction, options, gold):
    refs = sc.choice_references(options[gold], options)
    o, r = both("choice_eng", prediction, refs)
    assert o in (0.0, 100.0) and r in (0.0, 100.0)
    letter = sc.resolve_choice(prediction, options)
    assert r == (100.0 if letter == "ABCD"[gold] else 0.0)


def test_bad_references_are_refused_by_name():
    """Malformed references raise a ValueError naming the expected layout (a bare string is not a sequence of
    references; an empty one has no label); an unknown scorer key a KeyError listing the valid ones."""
    for refs in ("abc", ()):
        with pytest.raises(ValueError, match=r"^references must be a sequence of at least 1 strings, got "):
            score("scbench_kv", "abc", refs)
    with pytest.raises(ValueError, match=r"^choice_eng needs 4 options containing the answer; got \['A', 'B', "):
        sc.choice_references("E", ["A", "B", "C", "D"])
    for refs in (("E", "A", "B", "C", "D"), ("A", "A", "B", "C")):  # the answer not among the options; 3 options
        with pytest.raises(ValueError, match=r"^choice_eng references must be \(answer_text, option_A, option_B, "
                           r"option_C, option_D\) with the answer among the options, got "):  # fmt: skip
            score("scbench_choice_eng", "A", refs)
    with pytest.raises(KeyError, match="no SCBench scorer for 'nope'; valid: kv, prefix_suffix, vt, "):
        sc.scorer_names("nope")


def test_qa_chn_official_of_an_empty_answer_is_zero():
    """The official code loops over the answer string's characters: an empty answer has none, F1 0 (not 1)."""
    assert both("qa_chn", "北京", ("",)) == (0.0, 0.0)
