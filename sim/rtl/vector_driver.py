"""Drive the vector unit with a program of commands (until the chip's sequencer does it).

A program is a list of ``(cmd, a, b, stats)``: a :class:`~hw.spec.vector.VectorCmd`, the
elements it reads from ``i_a`` (a vector of ``cmd.length``, or the 256 LUT entries for
LOAD_LUT), the words it reads from ``i_b`` (or None) and the ``(sum x, sum x^2)`` pair it reads
from ``i_stats`` (LN_APPLY and RMS_APPLY only; ONEHOT reads an argmax record ``(index,
value)`` there and no ``i_a``; ARGMAX with ``pairs`` its ``length`` records
``[(index, value), ...]``). :func:`prepare` turns it into the beats of every
input stream and the golden outputs; the same beat lists feed Amaranth's simulator and the
cocotb testbench.
"""

from __future__ import annotations

from hw.spec.vector import VectorCmd, VectorOp, beats, pack_argmax
from hw.spec.vector_engine import STATS_IN_OPS, uses_b
from hw.tile.vector import VectorUnit, cmd_layout
from sim.golden.vector import VectorUnitModel
from sim.rtl.pysim import collect, run_sim, send_all

__all__ = ["vector_beats", "record_lane", "command_beats", "prepare", "check_outputs",
           "simulate_pysim"]


def vector_beats(values, lanes: int) -> list[dict]:
    """Split a 1-D vector into beat payloads (zero padding in the last beat)."""
    values = [int(v) for v in values]
    count = beats(len(values), lanes)
    values += [0] * (count * lanes - len(values))
    return [{"data": values[i * lanes:(i + 1) * lanes], "last": int(i == count - 1)}
            for i in range(count)]


def record_lane(index: int, value: int) -> int:
    """An argmax record's first 8 bytes as the unit carries them: one signed 64-bit lane."""
    return int(pack_argmax(index, value, 8).view("<i8")[0, 0])


def command_beats(cmd: VectorCmd, a, b, stats, lanes: int):
    """The beats one command consumes on ``i_a``, ``i_b`` and ``i_stats``."""
    op = cmd.op
    a_beats = vector_beats(a, lanes) if a is not None else []
    b_beats = vector_beats(b, lanes) if uses_b(op, cmd.per_channel) else []
    s_beats = [{"data": [int(stats[0]), int(stats[1])], "last": 1}] if (
        op in STATS_IN_OPS) else []
    if op is VectorOp.ONEHOT:
        s_beats = [{"data": [record_lane(*stats), 0], "last": 1}]
    if op is VectorOp.ARGMAX and cmd.pairs:
        s_beats = [{"data": [record_lane(*rec), 0], "last": 1} for rec in stats]
    return a_beats, b_beats, s_beats


def prepare(program, lanes: int) -> dict:
    """Input beats, golden outputs and expected output-beat counts of ``program``."""
    model = VectorUnitModel()
    job = {"cmds": [c.fields() for c, *_ in program], "a": [], "b": [], "stats": [],
           "expected": []}
    for cmd, a, b, stats in program:
        job["expected"].append(model.execute(cmd, a, b, stats))
        a_beats, b_beats, s_beats = command_beats(cmd, a, b, stats, lanes)
        job["a"] += a_beats
        job["b"] += b_beats
        job["stats"] += s_beats
    job["n_data"] = sum(beats(cmd.length, lanes) for (cmd, *_), e in
                        zip(program, job["expected"], strict=True) if "data" in e)
    job["n_stats"] = sum(1 for e in job["expected"] if "stats" in e or "record" in e)
    return job


def check_outputs(program, expected, data_beats, stats_beats, lanes: int, label: str = "rtl"):
    """Compare received ``(data, q, last)`` and ``(s1, s2, last)`` beats with the golden
    outputs lane by lane; raise :class:`AssertionError` naming command, beat and lane."""
    data_beats, stats_beats = iter(data_beats), iter(stats_beats)
    for k, ((cmd, *_), exp) in enumerate(zip(program, expected, strict=True)):
        if "stats" in exp:
            s1, s2, last = next(stats_beats)
            if (s1, s2, last) != (*exp["stats"], 1):
                raise AssertionError(f"{label} command {k} {cmd.op.name}: stats {(s1, s2)} "
                                     f"last {last} != golden {exp['stats']} last 1")
        if "record" in exp:
            got = next(stats_beats)
            want = (record_lane(*exp["record"]), 0, 1)
            if tuple(got) != want:
                raise AssertionError(f"{label} command {k} ARGMAX: record beat {tuple(got)} != "
                                     f"golden {want} (index, value {exp['record']})")
        if "data" not in exp:
            continue
        count = beats(cmd.length, lanes)
        for i in range(count):
            data, q, last = next(data_beats)
            if last != int(i == count - 1):
                raise AssertionError(f"{label} command {k} {cmd.op.name} beat {i}: last={last}")
            for j in range(lanes):
                e = i * lanes + j
                want = (int(exp["data"][e]), int(exp["q"][e])) if e < cmd.length else (0, 0)
                if (data[j], q[j]) != want:
                    raise AssertionError(
                        f"{label} command {k} {cmd.op.name} beat {i} lane {j} (element {e}): "
                        f"(data, q)=({data[j]}, {q[j]}) != golden {want}")
    if next(data_beats, None) is not None or next(stats_beats, None) is not None:
        raise AssertionError(f"{label}: more output beats than the golden model")


def simulate_pysim(program, *, lanes: int, d_model_max: int, rng=None, idle: float = 0.0,
                   stall: float = 0.0, max_cycles: int = 100_000,
                   pipeline: str = "short") -> dict:
    """Run ``program`` on the RTL in Amaranth's simulator and check it against golden.

    Random idle on every input stream and backpressure on both outputs when ``rng`` is given.
    Returns ``{"expected", "data", "stats", "cycles", "sim"}``: ``cycles`` counts from the
    first ``i_cmd`` transfer to the last output transfer. ``pipeline``: the unit's.
    """

    dut = VectorUnit(lanes=lanes, d_model_max=d_model_max, pipeline=pipeline)
    job = prepare(program, lanes)
    got = {}
    cycle = [0]
    stamps = {}

    async def counter(ctx):
        async for _ in ctx.tick():
            cycle[0] += 1

    def src(stream, items, key=None):
        async def bench(ctx):
            for item in items:
                await send_all(ctx, stream, [item], rng=rng, idle=idle)
                if key:
                    stamps.setdefault(key, cycle[0])
        return bench

    def sink(stream, count, key, convert):
        async def bench(ctx):
            got[key] = []
            for _ in range(count):
                got[key] += await collect(ctx, stream, 1, rng=rng, stall=stall, convert=convert)
                stamps["out"] = max(stamps.get("out", 0), cycle[0])
        return bench

    layout = cmd_layout()
    sim = run_sim(dut, [
        src(dut.i_cmd, [layout.const(c) for c in job["cmds"]], "cmd"),
        src(dut.i_a, job["a"]), src(dut.i_b, job["b"]), src(dut.i_stats, job["stats"]),
        sink(dut.o_data, job["n_data"], "data",
             lambda p: ([p.data[j] for j in range(lanes)], [p.q[j] for j in range(lanes)],
                        p.last)),
        sink(dut.o_stats, job["n_stats"], "stats", lambda p: (p.data[0], p.data[1], p.last)),
    ], processes=[counter], max_cycles=max_cycles)
    check_outputs(program, job["expected"], got["data"], got["stats"], lanes, "pysim")
    return {"expected": job["expected"], "data": got["data"], "stats": got["stats"],
            "cycles": stamps.get("out", 0) - stamps["cmd"], "sim": sim}
