"""ATTN engine (buffer + softmax + requantiser): cycles per launch in Amaranth's simulator vs
the cycle model ``launch_cycles`` (``docs/isa.md``, ATTN) and vs the ideal of the datapath.

One head of a whole causal sequence, every input word available at once:

- **preload** (seq = W keys, then W queries): the next query's score sweep overlaps this one's
  softmax and P.V; ideal W cycles per query (two D-wide MAC arrays, W slots each);
- **interleaved** (seq > W, window W: one key write before each query): the write waits for the
  previous query's output, so the score sweep, the softmax and the P.V serialise; ideal 2W.

Each run is also checked word for word against the ISS (``golden match``).
"""

import dataclasses

import numpy as np

from hw.spec import npu_preset
from hw.spec.memory import pack_rows, row_words
from hw.spec.timing.attention import launch_cycles
from hw.tile.attention_engine import AttentionEngine
from sim.compiler.assembler import Assembler
from sim.compiler.attention_launch import attention_launch, emit
from sim.iss import Iss
from sim.rtl.attention_engine_driver import run_attention_engine


def _run(npu, seq, d_head, *, interleaved, rng):
    n = npu.array_size
    rw = row_words(d_head, 1, n)
    iss = Iss(npu)
    for i in range(3):
        iss.write_words(i * seq * rw, pack_rows(rng.integers(-128, 128, (seq, d_head)), 1, n))
    launch = attention_launch(
        size=n, d_head=d_head, queries=seq, keys=seq, q_base=0, k_base=seq * rw,
        v_base=2 * seq * rw, o_base=3 * seq * rw, q_row_words=rw, k_row_words=rw,
        v_row_words=rw, o_row_words=rw, interleaved=interleaved,
        window=npu.attn_window if interleaved else 0, score_mult=45000, score_shift=20,
        out_mult=40000, out_shift=23)
    before = iss.mem.copy()
    asm = Assembler()
    emit(asm, launch)
    asm.halt()
    iss.run(asm.words())
    dut = AttentionEngine.for_npu(npu)
    mem, cycles, stats = run_attention_engine(dut, before, [launch], addr_bits=iss.addr_bits,
                                              max_cycles=200_000)
    model = launch_cycles(launch.regs, window=npu.attn_window, length=npu.softmax_len, size=n,
                          pipeline=npu.attention_pipeline)
    return cycles, model, bool((mem == iss.mem).all()), stats


def run(quick: bool):
    rows = []
    rng = np.random.default_rng(0)
    presets = ["tiny"] if quick else ["tiny", "fpga"]
    for preset in presets:
        npu = npu_preset(preset)
        npu = dataclasses.replace(npu, sram_bytes=max(npu.sram_bytes, 64 * 1024))
        W, d_head = npu.attn_window, min(npu.d_head_max, 2 * npu.array_size)
        tag = f"{preset} W={W} L={npu.softmax_len} h={d_head}"
        for kind, seq, ideal in (("preload", W, W), ("interleaved", W + 8, 2 * W)):
            cycles, model, ok, stats = _run(npu, seq, d_head, interleaved=kind == "interleaved",
                                            rng=rng)
            rows.append({"bench": f"ATTN {kind} seq={seq}, launch cycles, {tag}",
                         "value": cycles, "unit": "cycles", "ref": model,
                         "ratio": cycles / model,
                         "note": f"vs launch_cycles (exact model); golden match {ok}"})
            rows.append({"bench": f"ATTN {kind} cycles/query, {tag}", "value": cycles / seq,
                         "unit": "cycles", "ref": ideal, "ratio": cycles / seq / ideal,
                         "note": "ideal W (preload: sweeps overlap) or 2W (interleaved)"})
            rows.append({"bench": f"pysim speed, ATTN engine {tag} {kind}",
                         "value": stats["cycles_per_s"], "unit": "cycles/s", "ref": None,
                         "ratio": None, "note": ""})
    return rows
