"""Method options (``kvbench run --set METHOD.OPTION=VALUE``): parsing, typed conversion, labels, and rows."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

import kvbench.methods as methods_package
from kvbench.errors import KvbenchError
from kvbench.methods import (
    METHODS,
    EvictionMethod,
    declares_no_artifact,
    get_method,
    method_class,
    parse_method_options,
    register_method,
)
from kvbench.registry import RegistryError
from tests.fakes import FakeParent
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


@register_method
class ArtifactForTest(EvictionMethod):
    """Scores with an offline artifact (it overrides artifact_sha256) but has no prepare_offline of its own."""

    name = "test-artifact"

    def artifact_sha256(self, model_fingerprint):
        return "0" * 64

    def score(self, parent):
        return [torch.zeros(parent.n_kv_heads, parent.n) for _ in range(parent.n_attn_layers)]


@register_method
class DottedNameForTest(EvictionMethod):
    """A method whose registered name contains a dot (nothing forbids one), with one option."""

    name = "test-dotted.name"
    scale = 1.0
    options = {"scale": "score scale"}

    def score(self, parent):
        return [torch.zeros(parent.n_kv_heads, parent.n) for _ in range(parent.n_attn_layers)]


def test_list_methods_names_every_builtin_sorted():
    from kvbench.methods import list_methods

    names = list_methods()
    assert names == sorted(names)
    assert {"full", "random", "snapkv", "keydiff", "triattention", "kvzip", "gatesight", "oracle"} <= set(names)


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


def test_an_option_value_keeps_its_equals_signs():
    """METHOD.OPTION=VALUE: the value is everything after the first ``=``."""
    assert parse_method_options(["test-optnorm.tag=a=b"]) == {"test-optnorm": {"tag": "a=b"}}
    assert get_method("test-optnorm", options={"tag": "a=b"}).tag == "a=b"


def test_an_option_of_a_method_whose_name_has_a_dot():
    """An option is an attribute name (no dot), so METHOD.OPTION splits at the last dot: a registered name with a
    dot in it can be given options too."""
    got = parse_method_options(["test-dotted.name.scale=2"])
    assert got == {"test-dotted.name": {"scale": "2"}}
    assert get_method("test-dotted.name", options=got["test-dotted.name"]).scale == 2.0


def test_an_option_of_another_type_has_no_command_line_form():
    class TupleOption(EvictionMethod):
        name = "test-tuple-option"
        sizes = (1, 2)
        options = {"sizes": "no command-line form"}

        def score(self, parent):
            return []

    with pytest.raises(KvbenchError, match=r"^--set test-tuple-option\.sizes: this option has no command-line form$"):
        TupleOption().set_options({"sizes": "3"})


def _random_parent(sha256: str) -> FakeParent:
    """3 attention layers of 2 KV heads over 6 positions, for the context of hash ``sha256``."""
    parent = FakeParent([torch.zeros(2, 6, 4) for _ in range(3)])
    parent.sha256 = sha256  # what random reads of the context besides its shape
    return parent


def test_random_depends_on_the_seed_and_the_first_15_hex_digits_of_the_context_hash():
    same_prefix = "0123456789abcde"
    a = get_method("random", seed=1).score(_random_parent(same_prefix + "0" * 49))
    assert [tuple(s.shape) for s in a] == [(2, 6)] * 3
    assert all(bool(((s >= 0) & (s < 1)).all()) for s in a)
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[1], a[2])  # independent per layer
    # only the first 15 hex digits count: a hash differing from the 16th on gives the same scores
    b = get_method("random", seed=1).score(_random_parent(same_prefix + "f" * 49))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    # another context (its 15th hex digit differs) or another seed: another subset
    c = get_method("random", seed=1).score(_random_parent("0123456789abcdf" + "0" * 49))
    assert not any(torch.equal(x, y) for x, y in zip(a, c, strict=True))
    d = get_method("random", seed=2).score(_random_parent(same_prefix + "0" * 49))
    assert not any(torch.equal(x, y) for x, y in zip(a, d, strict=True))


@pytest.mark.parametrize("seed, generator_seed", [(0, 256), (2, 2_000_262)])
def test_random_scores_are_the_generator_stream_of_its_seed(seed, generator_seed):
    """The seeding the published random rows were made with: the generator seed is ``seed * 1_000_003`` plus
    the context hash's first 15 hex digits read as a hex number (here 0x100 = 256; 2 * 1_000_003 + 256 =
    2_000_262), then one ``torch.rand(H_kv, n)`` per layer in order. Changing it changes every random row."""
    got = get_method("random", seed=seed).score(_random_parent("000000000000100" + "f" * 49))
    gen = torch.Generator().manual_seed(generator_seed)
    want = [torch.rand(2, 6, generator=gen) for _ in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))


def test_the_base_class_has_no_calibration_step(tmp_path):
    random_cls = method_class("random")
    assert not random_cls.has_calibration()
    with pytest.raises(KvbenchError, match=r"^method random has no calibration step$"):
        random_cls.calibrate(None, ["a document"], max_tokens=8, out=tmp_path / "x")
    assert random_cls.describe_calibration(tmp_path / "x") == ""


def test_the_base_prepare_offline_is_an_instance_with_the_seed(tmp_path):
    random_cls = method_class("random")
    default = random_cls.prepare_offline(None, None, tmp_path)
    assert type(default) is random_cls and default.seed == 0
    assert random_cls.prepare_offline(None, None, tmp_path, seed=5).seed == 5


def test_prepare_offline_refuses_an_artifact_method_that_does_not_override_it(tmp_path):
    message = (
        "method test-artifact scores with an offline artifact: override prepare_offline to make one for a given "
        "model, so offline checks can run it"
    )
    with pytest.raises(KvbenchError, match=f"^{re.escape(message)}$"):
        ArtifactForTest.prepare_offline(None, None, tmp_path)


def test_register_method_refuses_what_is_not_an_eviction_method():
    class NotAMethod:
        name = "test-not-a-method"

    with pytest.raises(RegistryError, match=f"^method 'test-not-a-method': {re.escape(repr(NotAMethod))} is not an "):
        register_method(NotAMethod)

    def not_a_class():
        pass

    # not a class, and no name: the registry gets the empty name and refuses the object
    with pytest.raises(RegistryError, match=f"^method '': {re.escape(repr(not_a_class))} is not an EvictionMethod s"):
        register_method(not_a_class)
    assert "test-not-a-method" not in METHODS and "" not in METHODS


def test_register_method_refuses_a_class_without_a_name():
    class Nameless(EvictionMethod):
        def score(self, parent):
            return []

    class PlainNameless:
        pass

    with pytest.raises(RegistryError, match=r"^Nameless has no name$"):
        register_method(Nameless)
    with pytest.raises(RegistryError, match=r"^PlainNameless has no name$"):
        register_method(PlainNameless)


@pytest.mark.parametrize(
    "allocations, default",
    [(("flat", "test-no-such-allocation"), "flat"), (("flat",), "pyramid")],
)
def test_register_method_refuses_unknown_allocations_or_a_default_outside_them(allocations, default):
    class BadAllocations(EvictionMethod):
        name = "test-bad-allocations"

        def score(self, parent):
            return []

    BadAllocations.allocations, BadAllocations.default_allocation = allocations, default
    from kvbench.allocations import ALLOCATIONS  # the parameter ``allocations`` shadows the module

    known = ", ".join(ALLOCATIONS)
    assert known.startswith("flat, pyramid, gate, global")
    message = f"BadAllocations: bad allocations {allocations!r} / default {default!r} (known allocations: {known})"
    with pytest.raises(RegistryError, match=f"^{re.escape(message)}$"):
        register_method(BadAllocations)
    assert "test-bad-allocations" not in METHODS


def test_register_method_on_a_taken_name_names_both_sources():
    class RandomImpostor(EvictionMethod):
        name = "random"

        def score(self, parent):
            return []

    here = f"{__name__}.test_register_method_on_a_taken_name_names_both_sources.<locals>"
    mine = f"register_method({here}.RandomImpostor)"
    message = (
        f"method 'random' is already registered by built-in kvbench.methods.random_method:Random; {mine} registers "
        "it too. Rename or uninstall one of them"
    )
    with pytest.raises(RegistryError, match=f"^{re.escape(message)}$"):
        register_method(RandomImpostor)
    # an object with neither a module nor a qualified name is still named, as ?.?
    message = message.replace(mine, "register_method(?.?)")
    with pytest.raises(RegistryError, match=f"^{re.escape(message)}$"):
        register_method(SimpleNamespace(name="random"))
    assert METHODS.source("test-optnorm") == f"register_method({__name__}.OptionNormForTest)"
    assert method_class("random").__module__ == "kvbench.methods.random_method"


def test_declares_no_artifact_reads_the_method_name_of_a_label():
    assert declares_no_artifact("random") and declares_no_artifact("full")
    assert declares_no_artifact("random[x=1]")
    label = get_method("test-optnorm", options={"tag": "[b]"}).label
    assert label == "test-optnorm[tag=[b]]" and declares_no_artifact(label)
    assert not declares_no_artifact("test-artifact") and not declares_no_artifact("test-artifact[scale=2]")
    assert not declares_no_artifact("test-not-registered") and not declares_no_artifact("test-not-registered[x=1]")


def test_dir_of_the_package_names_every_public_name_before_first_use():
    assert set(methods_package.__all__) <= set(dir(methods_package))


def test_the_package_re_exports_the_base_names_on_first_use(monkeypatch):
    from kvbench.methods import base

    monkeypatch.delattr(methods_package, "QuestionInput", raising=False)  # as before its first use
    assert "QuestionInput" not in vars(methods_package)
    assert methods_package.QuestionInput is base.QuestionInput  # imported on first use
    assert methods_package.QuestionInput is base.QuestionInput  # and kept
    assert vars(methods_package)["QuestionInput"] is base.QuestionInput
    with pytest.raises(AttributeError, match=r"^module 'kvbench\.methods' has no attribute 'test_no_such_name'$"):
        _ = methods_package.test_no_such_name


@pytest.mark.parametrize(
    "options, message",
    [
        ({"nope": "1"}, r"method test-optnorm has no option 'nope' \(its options: largest, repeats, scale, tag\)"),
        ({"largest": "maybe"}, r"--set test-optnorm\.largest=maybe: expected true or false"),
        ({"scale": "big"}, r"--set test-optnorm\.scale=big: expected a number \(float\)"),
        ({"repeats": "1.5"}, r"--set test-optnorm\.repeats=1\.5: expected a number \(int\)"),
    ],
)
def test_bad_option_messages_name_the_method_and_option(options, message):
    with pytest.raises(KvbenchError, match=f"^{message}$"):
        get_method("test-optnorm", options=options)


def test_the_default_seed_is_0():
    parent = _random_parent("0123456789abcde" + "0" * 49)
    seed0 = get_method("random", seed=0).score(parent)
    for method in (get_method("random"), method_class("random")()):
        assert method.seed == 0
        assert all(torch.equal(x, y) for x, y in zip(method.score(parent), seed0, strict=True))


def test_select_asks_for_gate_means_only_for_an_allocation_that_needs_them():
    class GateMeansCounted(EvictionMethod):
        name = "test-gate-means-counted"
        calls = 0

        def gate_means(self, parent):
            self.calls += 1
            return [1.0] * parent.n_attn_layers

        def score(self, parent):
            return []

    parent = FakeParent([torch.zeros(2, 6, 4) for _ in range(3)])  # it has no gate means of its own
    scores = [torch.arange(6.0).repeat(2, 1) for _ in range(3)]
    method = GateMeansCounted()
    kept = method.select(parent, scores, 0.5, "flat")
    assert method.calls == 0
    assert [[h.tolist() for h in layer] for layer in kept] == [[[3, 4, 5]] * 2] * 3  # the 3 best of 6 per head
    method.select(parent, scores, 0.5, "gate")
    assert method.calls == 1
