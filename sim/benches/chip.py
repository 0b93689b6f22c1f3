"""Whole blocks on one chip: cycles vs the array-bound ideal, unit shares, overlap.

The ideal is ``total MACs / N²`` (every multiply-accumulate of the projections, the FFN and the
attention scores/values, at the full array rate). The d_model = 128 case runs on the exported
chip under Verilator (the chip runs from its own sequencer, so this is fast once built); quick
mode runs one tiny block on Amaranth's simulator.
"""

import dataclasses

from hw.spec import ModelConfig, npu_preset

from ..flows.simulate import simulate


def _run(npu, cfg, backend):
    report = simulate(npu, cfg, backend=backend)
    return (0 if report.golden_match else 1), report.to_json()


def _rows(label, npu, cfg, status, r):
    n = npu.array_size
    ideal = cfg.n_layers * cfg.macs_per_layer / n**2
    chip = r["per_chip"][0]
    cycles = r["cycles"]
    shares = ", ".join(f"{u} {v / cycles:.0%}" for u, v in chip["busy"].items())
    return [
        {"bench": f"chip cycles vs array-bound ideal, {label}", "value": cycles,
         "unit": "cycles", "ref": round(ideal), "ratio": cycles / ideal,
         "note": f"target <= 1.5 for d_model >= 128; golden match {r['golden_match']} "
                 f"(exit {status}); busy: {shares}"},
        {"bench": f"chip unit overlap, {label}", "value": chip["overlap_cycles"] / cycles,
         "unit": "of cycles", "note": "cycles with two or more units busy"},
        {"bench": f"chip sim speed ({r['backend']}), {label}", "value": r["sim"]["cycles_per_s"],
         "unit": "cycles/s", "note": f"{r['sim']['wall_s']:.1f} s"},
    ]


def run(quick: bool):
    rows = []
    tiny = npu_preset("tiny")
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4, d_head=8, d_ff=64, seq_len=8,
                      name="tiny-1layer")
    rows += _rows("1 tiny block on tiny (pysim)", tiny, cfg, *_run(tiny, cfg, "pysim"))
    if quick:
        return rows
    # d_model 128 on the 8x8 FPGA chip with a scratchpad large enough for the block.
    npu = dataclasses.replace(npu_preset("fpga"), sram_bytes=512 * 1024, name="fpga-512k")
    cfg = ModelConfig(n_layers=1, d_model=128, n_heads=2, d_head=64, d_ff=512, seq_len=32,
                      name="d128")
    rows += _rows("d_model 128, d_ff 512, seq 32 on 8x8 (verilator)", npu, cfg,
                  *_run(npu, cfg, "verilator"))
    return rows
