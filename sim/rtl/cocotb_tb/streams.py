"""Stream drivers for cocotb testbenches of exported Verilog (runs inside the cocotb process).

Amaranth flattens a stream member ``i_a`` into ``i_a__valid``, ``i_a__ready`` and
``i_a__payload`` (the struct packed LSB-first); the payload's ``lib.data`` layout packs and
unpacks it, so the testbench speaks the same dicts as the Amaranth testbenches.

:func:`run_streams` drives all sources and sinks from one per-cycle loop: after each rising edge
it presents the next beats, then samples ``valid``/``ready`` in the read-only phase, so a
transfer is counted in the cycle it happens, exactly as Amaranth's simulator counts it.
"""

from __future__ import annotations

from cocotb.triggers import ReadOnly, RisingEdge

__all__ = ["reset", "run_streams"]


async def reset(dut, cycles: int = 2):
    dut.rst.value = 1
    for _ in range(cycles):
        await RisingEdge(dut.clk)
    dut.rst.value = 0


async def run_streams(dut, *, sources: dict, sinks: dict, max_cycles: int = 1_000_000) -> dict:
    """Send ``sources[name] = (layout, beats)``; receive ``sinks[name] = (layout, count)``.

    Sinks are always ready. Returns ``{"received": {name: [payload consts]}, "first_in": {name:
    cycle}, "last_out": {name: cycle}, "cycles": n}``, cycles counted from the first loop cycle.
    Raises :class:`TimeoutError` after ``max_cycles``.
    """
    # Pack payloads and look up handles once: the per-cycle loop is the simulation's hot path.
    packed = {n: [layout.const(b).as_bits() for b in beats] for n, (layout, beats) in
              sources.items()}
    src = {n: (getattr(dut, f"{n}__valid"), getattr(dut, f"{n}__ready"),
               getattr(dut, f"{n}__payload")) for n in sources}
    snk = {n: (getattr(dut, f"{n}__valid"), getattr(dut, f"{n}__payload")) for n in sinks}
    pos = dict.fromkeys(sources, 0)
    raw = {name: [] for name in sinks}
    first_in, last_out = {}, {}
    for name in sinks:
        getattr(dut, f"{name}__ready").value = 1
    cycle = 0
    clk = dut.clk
    while any(len(raw[n]) < sinks[n][1] for n in sinks):
        if cycle >= max_cycles:
            raise TimeoutError(f"stream testbench exceeded max_cycles={max_cycles}")
        await RisingEdge(clk)
        for name, beats in packed.items():
            valid, _ready, payload = src[name]
            if pos[name] < len(beats):
                payload.value = beats[pos[name]]
                valid.value = 1
            else:
                valid.value = 0
        await ReadOnly()
        for name, (valid, ready, _payload) in src.items():
            if pos[name] < len(packed[name]) and int(valid.value) and int(ready.value):
                first_in.setdefault(name, cycle)
                pos[name] += 1
        for name, (valid, payload) in snk.items():
            if int(valid.value):
                raw[name].append(payload.value.to_unsigned())
                last_out[name] = cycle
        cycle += 1
    received = {n: [sinks[n][0].from_bits(r) for r in raw[n]] for n in sinks}
    return {"received": received, "first_in": first_in, "last_out": last_out, "cycles": cycle}
