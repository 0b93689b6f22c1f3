"""The timing constants of hw.spec.timing, broken on purpose: the gateware either refuses a
value its registers do not make or is sized by it, and the timing models move with it, so the
gateware and the models cannot drift apart unnoticed."""

import pytest
from amaranth.lib.fifo import SyncFIFO

import hw.spec.timing.attention as attn_timing
import hw.tile.attention as attention
import hw.tile.matmul as matmul
import hw.tile.scratchpad as scratchpad
import hw.tile.softmax as softmax
import hw.tile.vector_engine as vector_engine
import sim.timing.engines as engines
from hw.spec.attention import FLAG_PARTIAL, FLAG_REDUCED, softmax_lanes
from hw.spec.timing import chip as chip_timing
from hw.spec.timing import matmul as matmul_timing
from sim.rtl.pysim import run_sim

# (gateware module that reads the constant, its name, the spec's module, a constructor)
STRUCTURAL = [
    *[(attention, name, chip_timing,
       lambda: attention.AttentionBuffer(window=4, d_head=2, length=4))
      for name in ("ATTN_DOT_CYCLES", "ATTN_PARTIAL_CYCLES", "ATTN_REDUCED_CYCLES",
                   "ATTN_PV_CYCLES")],
    (scratchpad, "READ_LATENCY", chip_timing,
     lambda: scratchpad.Scratchpad(words=16, banks=2, word_bytes=1, read_ports=1,
                                   write_ports=1)),
    (matmul, "REQUANT_LATENCY", matmul_timing, lambda: matmul.Requantizer(size=2)),
]


@pytest.mark.parametrize("module, name, spec, build", STRUCTURAL,
                         ids=[name for _, name, _, _ in STRUCTURAL])
def test_structural_constant_changed_is_refused(monkeypatch, module, name, spec, build):
    value = getattr(spec, name)
    assert getattr(module, name) == value, f"{module.__name__} does not use the spec's {name}"
    build()
    monkeypatch.setattr(module, name, value + 1)
    with pytest.raises(ValueError, match=rf"^{name}={value + 1} \(hw/spec/timing\) is not the "
                                         rf"{value} .* that hw/tile/\w+\.py builds"):
        build()


@pytest.mark.parametrize("pipeline", ["short", "deep"])
def test_softmax_stages_changed_is_refused(monkeypatch, pipeline):
    """The softmax's row stages per pipeline (5, 6) come from ``softmax_stages``, which the
    unit checks against the stages it builds."""
    real = chip_timing.softmax_stages
    assert softmax.softmax_stages is real, "hw/tile/softmax.py does not use the spec's function"
    value = real(pipeline)
    assert softmax.SoftmaxUnit(length=4, lanes_per_cycle=4, pipeline=pipeline).latency == value + 1
    monkeypatch.setattr(softmax, "softmax_stages", lambda p: real(p) + 1)
    with pytest.raises(ValueError, match=rf"^softmax_stages={value + 1} \(hw/spec/timing\) is "
                                         rf"not the {value} row stages .* that "
                                         rf"hw/tile/softmax\.py builds"):
        softmax.SoftmaxUnit(length=4, lanes_per_cycle=4, pipeline=pipeline)


def _model_cycles(flags, limit=10_000, pipeline="short"):
    """The ISS engine model's cycles of one query over one key, every word available."""
    model = engines.AttentionModel(window=16, length=16, size=4, pipeline=pipeline)
    model.start({"AT_QUERIES": 1, "AT_KEYS": 1, "AT_FLAGS": flags, "AT_D_HEAD": 4})
    for t in range(limit):
        if not model.active:
            return t
        model.step(True, True, True, model.out_valid())
    raise AssertionError("never idle")


def _closed_form(flags, pipeline="short"):
    return attn_timing.launch_cycles({"AT_QUERIES": 1, "AT_KEYS": 1, "AT_FLAGS": flags,
                                      "AT_D_HEAD": 4}, window=16, length=16, size=4,
                                     pipeline=pipeline)


BEATS = 16 // softmax_lanes(16)


@pytest.mark.parametrize("name, flags, moves", [
    ("ATTN_DOT_CYCLES", 0, 1),
    ("ATTN_PARTIAL_CYCLES", FLAG_PARTIAL, 1),
    ("ATTN_REDUCED_CYCLES", FLAG_REDUCED, 1),
    ("ATTN_PV_CYCLES", 0, 1),
])
def test_models_follow_the_constant(monkeypatch, name, flags, moves):
    """The engine model and the closed form read the constant the gateware checks: one more
    cycle on a lone query's path."""
    real = _model_cycles(flags)
    assert _closed_form(flags) == real
    value = getattr(chip_timing, name)
    monkeypatch.setattr(engines, name, value + 1)
    monkeypatch.setattr(attn_timing, name, value + 1)
    assert _model_cycles(flags) == real + moves
    assert _closed_form(flags) == real + moves


@pytest.mark.parametrize("pipeline", ["short", "deep"])
def test_models_follow_softmax_stages(monkeypatch, pipeline):
    """The engine model and the closed form read ``softmax_stages(pipeline)``: a row stage
    more is one more slot of ``L / P`` beats on a lone query's path; the deep pipeline's sixth
    stage is one slot more than the short one's five."""
    real = chip_timing.softmax_stages
    cycles = _model_cycles(0, pipeline=pipeline)
    assert _closed_form(0, pipeline) == cycles
    if pipeline == "deep":
        short = _model_cycles(0)
        assert cycles == short + BEATS + chip_timing.attn_out_pipe("deep"), (cycles, short)
    monkeypatch.setattr(engines, "softmax_stages", lambda p: real(p) + 1)
    monkeypatch.setattr(attn_timing, "softmax_stages", lambda p: real(p) + 1)
    assert _model_cycles(0, pipeline=pipeline) == cycles + BEATS
    assert _closed_form(0, pipeline) == cycles + BEATS


def _grants(depth_patch, monkeypatch):
    """Reads a scratchpad port takes while nothing drains its FIFO, in pysim."""
    if depth_patch is not None:
        monkeypatch.setattr(scratchpad, "READ_FIFO_DEPTH", depth_patch)
    dut = scratchpad.Scratchpad(words=16, banks=2, word_bytes=1, read_ports=1, write_ports=1)
    port = dut.rd[0]
    granted = []

    async def bench(ctx):
        ctx.set(port.i_addr.valid, 1)
        ctx.set(port.o_data.ready, 0)
        for _ in range(12):
            granted.append(ctx.get(port.i_addr.ready))
            await ctx.tick()

    run_sim(dut, [bench], max_cycles=100)
    return sum(granted)


def test_read_fifo_is_sized_by_the_constant(monkeypatch):
    """The cycle model (sim.timing.cycle) grants a read while ``level + in flight <
    READ_FIFO_DEPTH``; so does the gateware, for the real value and for one more."""
    assert _grants(None, monkeypatch) == chip_timing.READ_FIFO_DEPTH
    assert _grants(chip_timing.READ_FIFO_DEPTH + 1, monkeypatch) == \
        chip_timing.READ_FIFO_DEPTH + 1


def test_vector_out_fifo_is_sized_by_the_constant(monkeypatch):
    depths = []

    class Recording(SyncFIFO):
        def __init__(self, *, width, depth):
            depths.append(depth)
            super().__init__(width=width, depth=depth)

    monkeypatch.setattr(vector_engine, "SyncFIFO", Recording)

    def built(value):
        monkeypatch.setattr(vector_engine, "VEC_OUT_FIFO_DEPTH", value)
        depths.clear()
        vector_engine.VectorEngine(lanes=4, d_model_max=64).elaborate(None)
        return sorted(depths)

    value = chip_timing.VEC_OUT_FIFO_DEPTH
    real, more = built(value), built(value + 1)
    assert real == [value], real
    assert more == [value + 1], more
