"""Method options (``kvbench run --set METHOD.OPTION=VALUE``): parsing, typed conversion, labels, and rows."""

from __future__ import annotations

import json

import pytest

from kvbench.errors import KvbenchError
from kvbench.methods import EvictionMethod, get_method, parse_method_options, register_method
from tests.test_cli import kvbench


@register_method
class OptionNormForTest(EvictionMethod):
    """Keeps the keys of smallest (or, with ``largest``, largest) norm; options of every type."""

    name = "test-optnorm"
    largest = False
    scale = 1.0
    repeats = 1
    tag = "a"
    options = {"largest": "keep the largest norms", "scale": "score scale", "repeats": "unused", "tag": "unused"}

    def score(self, parent):
        sign = 1.0 if self.largest else -1.0
        return [sign * self.scale * parent.keys(f).float().norm(dim=-1) for f in range(parent.n_attn_layers)]


def test_parse_method_options():
    got = parse_method_options(["test-optnorm.largest=true", "test-optnorm.scale= 2.5", "snapkv.x=1"])
    assert got == {"test-optnorm": {"largest": "true", "scale": "2.5"}, "snapkv": {"x": "1"}}
    assert parse_method_options([]) == {}


@pytest.mark.parametrize(
    "item, message",
    [
        ("test-optnorm.largest", "METHOD.OPTION=VALUE"),
        ("largest=true", "METHOD.OPTION=VALUE"),
        (".largest=true", "METHOD.OPTION=VALUE"),
        ("nope.largest=true", "valid methods"),
    ],
)
def test_parse_method_options_errors(item, message):
    with pytest.raises(KvbenchError, match=message):
        parse_method_options([item])


def test_an_option_given_twice_is_refused():
    with pytest.raises(KvbenchError, match="twice"):
        parse_method_options(["test-optnorm.scale=1", "test-optnorm.scale=2"])


def test_options_are_typed_by_their_default_and_label_the_method():
    default = get_method("test-optnorm")
    assert default.label == "test-optnorm" and default.method_options() == {}
    m = get_method("test-optnorm", options={"largest": "TRUE", "scale": "2", "repeats": "3", "tag": "b c"})
    assert (m.largest, m.scale, m.repeats, m.tag) == (True, 2.0, 3, "b c")
    assert isinstance(m.scale, float) and isinstance(m.repeats, int)
    assert m.method_options() == {"largest": True, "repeats": 3, "scale": 2.0, "tag": "b c"}
    assert m.label == "test-optnorm[largest=true,repeats=3,scale=2.0,tag=b c]"
    # setting an option to its default value is the default method
    same = get_method("test-optnorm", options={"largest": "no", "scale": "1"})
    assert same.label == "test-optnorm" and same.method_options() == {}
    # instances do not leak into the class
    assert OptionNormForTest.largest is False and get_method("test-optnorm").largest is False


@pytest.mark.parametrize(
    "options, message",
    [
        ({"nope": "1"}, "no option 'nope'"),
        ({"largest": "maybe"}, "expected true or false"),
        ({"scale": "big"}, "expected a number"),
        ({"repeats": "1.5"}, "expected a number"),
    ],
)
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(KvbenchError, match=message):
        get_method("test-optnorm", options=options)


def test_method_without_options_names_none():
    with pytest.raises(KvbenchError, match=r"no option 'x' \(its options: none\)"):
        get_method("random", options={"x": "1"})


def test_run_with_set_writes_labelled_rows_beside_the_default(tmp_path, capsys):
    out = tmp_path / "run"
    base = ["run", "--model", "tiny-random", "--method", "test-optnorm", "--p", "0.3", "--limit", "1"]
    base += ["--no-reference"]  # only the option variants' rows
    base += ["--length", "900", "--out", str(out)]
    assert kvbench(*base, "--set", "test-optnorm.largest=true") == 0, capsys.readouterr().err
    assert kvbench(*base) == 0, capsys.readouterr().err  # the default is not "already present"
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    by_method = {r["method"]: r for r in rows}
    assert set(by_method) == {"test-optnorm[largest=true]", "test-optnorm"} and len(rows) == 2
    assert by_method["test-optnorm[largest=true]"]["method_options"] == {"largest": True}
    assert "method_options" not in by_method["test-optnorm"]
    runs = json.loads((out / "manifest.json").read_text())["runs"]
    assert runs[0]["config"]["method_options"] == {"test-optnorm": {"largest": "true"}}
    # resuming the variant finds its row
    assert kvbench(*base, "--set", "test-optnorm.largest=true") == 0
    assert "1 already present" in capsys.readouterr().err.replace("\n", " ")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--set", "random.x=1"], "which --method does not run"),
        (["--set", "test-optnorm.nope=1"], "no option 'nope'"),
        (["--set", "test-optnorm.largest"], "METHOD.OPTION=VALUE"),
    ],
)
def test_run_set_errors_exit_2(tmp_path, capsys, extra, message):
    args = ["run", "--model", "tiny-random", "--method", "test-optnorm", "--limit", "1", "--out", str(tmp_path / "o")]
    code = kvbench(*args, *extra)
    err = capsys.readouterr().err.replace("\n", " ")
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "o" / "results.jsonl").exists() or not (tmp_path / "o" / "results.jsonl").read_text()
