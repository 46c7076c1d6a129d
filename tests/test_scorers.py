"""Scorer registry and RULER's official metrics, checked on hand-worked examples."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvbench import scorers
from kvbench.registry import Registry
from kvbench.scorers import UnknownScorerError, get_scorer, list_scorers, register_scorer, score
from kvbench.scorers.ruler import postprocess_pred, string_match_all, string_match_part


def test_builtins_imported_lazily_on_first_lookup():
    code = (
        "import sys, kvbench.scorers as s\n"
        "assert 'kvbench.scorers.ruler' not in sys.modules\n"
        "s.get_scorer('string_match_all')\n"
        "assert 'kvbench.scorers.ruler' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_builtins_registered():
    assert {"string_match_all", "string_match_part"} <= set(list_scorers())
    assert get_scorer("string_match_all") is string_match_all
    assert get_scorer("string_match_part") is string_match_part


def test_unknown_scorer_lists_valid_names():
    with pytest.raises(UnknownScorerError) as err:
        get_scorer("no_such_scorer")
    assert isinstance(err.value, KeyError)
    msg = str(err.value)
    assert "no_such_scorer" in msg and "string_match_all" in msg and "string_match_part" in msg


def test_register_custom_and_conflict(monkeypatch):
    # register into a throwaway registry with the same built-ins
    monkeypatch.setattr(scorers, "SCORERS", Registry("scorer", "kvbench.scorers", scorers.BUILTIN_SCORERS))

    @register_scorer("test_exact_match_tmp")
    def exact(prediction, references):
        return 100.0 if prediction in references else 0.0

    assert score("test_exact_match_tmp", "a", ["a"]) == 100.0
    assert register_scorer("test_exact_match_tmp")(exact) is exact  # re-registering the same fn is fine
    with pytest.raises(ValueError, match="already registered"):
        register_scorer("test_exact_match_tmp")(lambda p, r: 0.0)


def test_registration_messages_name_the_function_and_the_fault(monkeypatch):
    """A conflict names where the taken name came from (module and qualified name, '?' for what a callable
    lacks); a non-callable is refused by name."""
    monkeypatch.setattr(scorers, "SCORERS", Registry("scorer", "kvbench.scorers", scorers.BUILTIN_SCORERS,
                                                     check=scorers._check_scorer))

    def first(prediction, references):
        return 0.0

    register_scorer("test_tmp_a")(first)
    with pytest.raises(ValueError, match=r"register_scorer\(tests\.test_scorers\.test_registration_messages_name_"
                       r"the_function_and_the_fault\.<locals>\.first\)"):
        register_scorer("test_tmp_a")(lambda p, r: 1.0)

    class Callable:  # an instance: a module through its class, no __qualname__
        def __call__(self, prediction, references):
            return 0.0

    register_scorer("test_tmp_b")(Callable())
    with pytest.raises(ValueError, match=r"register_scorer\(tests\.test_scorers\.\?\)"):
        register_scorer("test_tmp_b")(first)
    with pytest.raises(ValueError, match=r"^scorer 'test_tmp_c': 5 is not callable$"):
        register_scorer("test_tmp_c")(5)


def test_hand_worked_all_vs_part():
    refs = ["1234567", "89"]
    pred = "the number is 1234567."
    assert score("string_match_all", pred, refs) == 50.0
    assert score("string_match_part", pred, refs) == 100.0
    assert score("string_match_all", "1234567 and 89", refs) == 100.0
    assert score("string_match_all", "nothing here", refs) == 0.0
    assert score("string_match_part", "nothing here", refs) == 0.0
    assert string_match_all("a b", ["a", "b", "c"]) == pytest.approx(200 / 3)  # not rounded per item


def test_case_insensitive():
    assert string_match_all("The Answer Is WONDERFUL-Otter", ["wonderful-otter"]) == 100.0
    assert string_match_part("answer: abc", ["ABC"]) == 100.0


def test_control_characters_become_newlines():
    assert postprocess_pred("  \x00ab\tc\x1fd\x7f \n") == "ab\nc\nd\x7f"
    # a tab between words breaks a reference that contains a space ...
    assert string_match_all("magic\tnumber", ["magic number"]) == 0.0
    assert string_match_all("magic\x1bnumber", ["magic\nnumber"]) == 100.0
    # ... and a reference spanning a stripped edge no longer matches
    assert string_match_all("\t12 ", [" 12"]) == 0.0
    assert string_match_all(" 12 ", ["12"]) == 100.0


@pytest.mark.parametrize("name", ["string_match_all", "string_match_part"])
@pytest.mark.parametrize("refs", [[], (), "1234567"])
def test_empty_or_bare_string_references_raise(name, refs):
    with pytest.raises(ValueError, match=r"^references must be a non-empty sequence of strings, got "):
        score(name, "1234567", refs)
