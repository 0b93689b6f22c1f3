"""The strategy registry: one entry per strategy, the choices everything takes from it, its
refusals, and every strategy bit-exact on the ISS through it."""

import dataclasses

import pytest

from hw.spec import model_preset, npu_preset
from sim.errors import BadInput
from sim.flows.simulate import simulate
from sim.planner.plan import plan
from sim.strategies import GRIDS, GRIDS3, NAMES, REGISTRY, get, table
from sim.strategies.base import Strategy, register
from tests.helpers import ROOT

TINY = npu_preset("tiny")
MODEL = dataclasses.replace(model_preset("tiny"), n_layers=2)


def test_names_are_the_registry_in_order():
    assert set(NAMES) == set(REGISTRY)
    assert NAMES[0] == "single"
    assert tuple(n for n in NAMES if n.count("+") == 1) == GRIDS
    assert tuple(n for n in NAMES if n.count("+") == 2) == GRIDS3 == ("data+pipeline+head",)
    assert all(get(n).is_grid for n in GRIDS + GRIDS3)


def test_unknown_name_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="strategy 'tensor' is not one of single, head"):
        get("tensor")


def test_a_name_registers_once():
    class Again(Strategy):
        name = "head"
    with pytest.raises(ValueError, match="'head' is empty or taken"):
        register(Again())


def _chips(name):
    if get(name).one_chip:
        return {"chips": 1}
    if get(name).is_grid:
        return {"grid": "x".join(["2"] * len(get(name).parts))}
    return {"chips": 2}


@pytest.mark.parametrize("name", NAMES)
def test_every_strategy_is_bit_exact_on_the_iss(name):
    seed = 3
    print(f"seed={seed}")
    report = simulate(TINY, MODEL, strategy=name, backend="iss", seed=seed, batch=4,
                      reference="none", **_chips(name))
    assert report.golden_match, (name, report.first_mismatch)
    assert report.strategy == name


@pytest.mark.parametrize("name", [n for n in NAMES if "smooth16" not in get(n).quants])
def test_a_scheme_the_strategy_does_not_compile_is_refused_by_the_registry(name):
    with pytest.raises(BadInput, match=f"--strategy {name} does not compile "
                                       "quant=\"smooth16\" yet .*single, head"):
        simulate(TINY, MODEL, strategy=name, backend="iss", quant="smooth16",
                 reference="none", **_chips(name))


@pytest.mark.parametrize("name, kw, needle", [
    ("head", {"chips": 2, "microbatches": 2}, "--microbatches applies to strategies with a "
                                              "pipeline"),
    ("data+head", {"grid": "2x2", "microbatches": 2}, "--microbatches applies"),
    ("pipeline", {"chips": 2, "grid": "1x2"}, "--grid applies to head\\+pipeline, data\\+head, "
                                              "data\\+pipeline, data\\+pipeline\\+head, not "
                                              "--strategy pipeline"),
    ("head", {"chips": 2, "reduce": "all_reduce"}, "reduce applies to --strategy hidden"),
    ("single", {"chips": 2}, "--strategy single runs on one chip, not --chips 2"),
    ("head+pipeline", {"chips": 4}, "--strategy head\\+pipeline needs --grid AxB"),
])
def test_options_a_strategy_does_not_take_are_refused(name, kw, needle):
    with pytest.raises(BadInput, match=needle):
        simulate(TINY, MODEL, strategy=name, backend="iss", batch=4, reference="none", **kw)


def test_the_planner_refuses_a_scheme_the_strategy_does_not_compile():
    model = dataclasses.replace(MODEL, quant="smooth16")
    hidden = plan(TINY, model, chips=2, strategy="hidden").strategies[0]
    assert not hidden.fits
    assert any("--strategy hidden does not compile quant=\"smooth16\"" in str(r)
               for r in hidden.reasons), hidden.reasons
    assert plan(TINY, model, chips=2, strategy="head").strategies[0].fits


def test_the_docs_table_is_the_registry():
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("<!-- strategies table -->\n") + len("<!-- strategies table -->\n")
    assert text[start:text.index("\n<!-- end strategies table -->")] == table()
