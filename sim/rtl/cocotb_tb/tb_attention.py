"""cocotb testbench for the exported attention buffer (``npu export --top attention``).

One per-cycle loop plays the same three roles as ``sim.rtl.attention_driver.run_attention`` with no
idle or backpressure, so that transfers land on the same clock edges as in Amaranth's simulator:
a sequencer offers the commands in order (``i_kv`` / ``i_q``); a responder takes the query's
``o_partial`` (split mode), offers its reduced row, takes ``o_scores`` and offers its
probabilities, one step after the other; a collector is always ready on ``o_out``. After each
rising edge the loop presents this cycle's inputs, then samples ``valid``/``ready`` in the
read-only phase: a transfer seen there happens at the next edge. Edges are numbered like the
Amaranth testbench's (the first edge that can transfer is edge 1).
"""

import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from hw.tile.attention import (
    kv_layout,
    out_layout,
    probs_layout,
    q_layout,
    raw_layout,
    scores_layout,
)
from sim.rtl.cocotb_tb import tb_data, tb_report


async def reset(dut, cycles: int = 2):
    dut.rst.value = 1
    for _ in range(cycles):
        await RisingEdge(dut.clk)
    dut.rst.value = 0


def _stream(dut, name):
    return (getattr(dut, f"{name}__valid"), getattr(dut, f"{name}__ready"),
            getattr(dut, f"{name}__payload"))


@cocotb.test()
async def attention_sequence(dut):
    d = tb_data()
    n_cmd, D = d["q_data"].shape
    nq, L = d["probs"].shape
    kvl, ql, rawl, scl, pl, outl = (kv_layout(D), q_layout(D), raw_layout(L), scores_layout(L),
                                    probs_layout(L), out_layout(D))
    cmds = []
    for i in range(n_cmd):
        if d["kind"][i] == 0:
            cmds.append(("i_kv", kvl.const({
                "data": [int(x) for x in d["kv_data"][i]], "pos": int(d["kv_pos"][i]),
                "first": int(d["kv_first"][i]), "last": 0}).as_bits()))
        else:
            cmds.append(("i_q", ql.const({
                "data": [int(x) for x in d["q_data"][i]], "pos": int(d["q_pos"][i]),
                "mult": int(d["q_mult"][i]), "shift": int(d["q_shift"][i]),
                "bidir": int(d["q_bidir"][i]), "split": int(d["q_split"][i]),
                "last": int(d["q_last"][i])}).as_bits()))
    split = [int(x) for x in d["split"]]
    probs = [pl.const({"data": [int(x) for x in row], "last": 0}).as_bits() for row in d["probs"]]
    reduced = [rawl.const({"data": [int(x) for x in row], "last": 0}).as_bits()
               for row in d["reduced"]]
    s = {name: _stream(dut, name) for name in
         ("i_kv", "i_q", "o_partial", "i_reduced", "o_scores", "i_probs", "o_out")}
    for name in ("i_kv", "i_q", "i_reduced", "i_probs"):
        s[name][0].value = 0
    for name in ("o_partial", "o_scores", "o_out"):
        s[name][1].value = 0

    Clock(dut.clk, 10, unit="ns").start()
    await reset(dut)
    res = [{} for _ in range(nq)]
    ci = nq_seen = rn = n_out = 0
    step = "partial" if nq and split[0] else "scores"
    cycle = 0
    start = time.perf_counter()
    max_cycles = int(d["max_cycles"])
    while n_out < nq:
        assert cycle < max_cycles, f"no progress: {n_out} of {nq} outputs by cycle {cycle}"
        await RisingEdge(dut.clk)
        # Present this cycle's inputs.
        for name in ("i_kv", "i_q"):
            s[name][0].value = int(ci < n_cmd and cmds[ci][0] == name)
        if ci < n_cmd:
            s[cmds[ci][0]][2].value = cmds[ci][1]
        active = rn < nq
        s["o_partial"][1].value = int(active and step == "partial")
        s["i_reduced"][0].value = int(active and step == "reduced")
        s["o_scores"][1].value = int(active and step == "scores")
        s["i_probs"][0].value = int(active and step == "probs")
        if active and step == "reduced":
            s["i_reduced"][2].value = reduced[rn]
        if active and step == "probs":
            s["i_probs"][2].value = probs[rn]
        s["o_out"][1].value = 1
        await ReadOnly()
        edge = cycle + 1  # the edge at which what is sampled now transfers

        def fire(name):
            return int(s[name][0].value) and int(s[name][1].value)

        if ci < n_cmd and fire(cmds[ci][0]):
            if cmds[ci][0] == "i_q":
                res[nq_seen]["t_q"] = edge
                nq_seen += 1
            ci += 1
        if active:
            if step == "partial" and fire("o_partial"):
                p = rawl.from_bits(s["o_partial"][2].value.to_unsigned())
                res[rn]["partial"] = [int(x) for x in p.data]
                res[rn]["t_partial"] = edge
                step = "reduced"
            elif step == "reduced" and fire("i_reduced"):
                res[rn]["t_reduced"] = edge
                step = "scores"
            elif step == "scores" and fire("o_scores"):
                sc = scl.from_bits(s["o_scores"][2].value.to_unsigned())
                res[rn].update(scores=[int(x) for x in sc.data], mask=[int(x) for x in sc.mask],
                               scores_last=int(sc.last), t_scores=edge)
                step = "probs"
            elif step == "probs" and fire("i_probs"):
                res[rn]["t_probs"] = edge
                rn += 1
                step = "partial" if rn < nq and split[rn] else "scores"
        if fire("o_out"):
            o = outl.from_bits(s["o_out"][2].value.to_unsigned())
            res[n_out].update(out=[int(x) for x in o.data], out_last=int(o.last), t_out=edge)
            n_out += 1
        cycle += 1
    wall = time.perf_counter() - start
    tb_report({"queries": res, "cycles": cycle, "wall_s": wall})
