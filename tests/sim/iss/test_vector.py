"""The ISS's vector executor (sim.iss.vector): inconsistent VEC registers are refused."""

import dataclasses

import pytest

from hw.spec.memory import pack_rows
from hw.spec.vector import VectorOp, pack_requant
from hw.spec.vector_engine import VecFlags
from sim.compiler.vector_launch import Rows, add_launch, emit, requant_launch
from sim.iss import IssError
from tests.helpers import assemble, vector_iss, vector_regs_program

_iss_with = vector_regs_program


def _good_add(size=4):
    t = Rows(0, 2, 2, 2)
    return add_launch(size=size, length=4, a=t, b=Rows(10, 2, 2, 2), out=Rows(20, 2, 2, 2))


@pytest.mark.parametrize("change, match", [
    ({"VU_OP": int(VectorOp.LN_STATS)}, r"LN_STATS writes its statistics through WR2: set "
                                        r"wr_q and clear wr_data"),
    ({"VU_OP": int(VectorOp.LN_APPLY), "VU_N": 0}, r"LN_APPLY with VU_N=0: must be in "
                                                   r"1\.\.65535"),
    ({"VU_OP": int(VectorOp.RMS_APPLY), "VU_N": 0}, r"RMS_APPLY with VU_N=0: must be in "
                                                    r"1\.\.65535"),
    ({"VU_OP": 16}, r"VU_OP=16: not a vector-unit op"),
    ({"VU_FLAGS": 1 << 12}, r"sets bits outside 0\.\.11"),
    ({"VU_FLAGS": VecFlags(a_bytes=2, b_bytes=2, d_bytes=2, pairs=True).encode()},
     r"ADD has no pair mode: clear pairs"),
    ({"VU_FLAGS": 3 << 2}, r"a_bytes code 3 is invalid"),
    ({"VU_ROWS": 0}, r"VU_ROWS=0: must be in 1\.\.65535"),
    ({"VU_LEN": 0}, r"VU_LEN=0: must be in 1\.\.65535"),
    ({"VU_LEN": 3}, r"operand A via RD3 walks 4 words, but 2 rows of 3 x 2-byte elements "
                    r"are 4 words|RD4 walks"),
    ({"VU_LEN": 5}, r"operand A via RD3 walks 4 words, but 2 rows of 5 x 2-byte elements "
                    r"are 6 words"),
    ({"VU_FLAGS": VecFlags(a_bytes=2, b_bytes=2, d_bytes=2, wr_data=False).encode()},
     r"ADD writes nothing"),
    ({"VU_FLAGS": VecFlags(a_bytes=2, b_bytes=2, d_bytes=2, wr_q=True).encode()},
     r"ADD has no q output"),
    ({"VU_MULT": 1 << 16}, r"mult=65536 must be an integer in \[0, 65535\]"),
    ({"VU_GSHIFT": 64}, r"gshift=64 must be"),
])
def test_iss_rejects_inconsistent_registers(change, match):
    launch = _good_add()
    regs = dict(launch.regs, **change)
    iss, prog = _iss_with(regs, launch.descs)
    if change.get("VU_LEN") == 3:
        # 3 int16 elements still take 2 words per row: the launch is consistent.
        iss.run(prog)
        return
    with pytest.raises(IssError, match=match):
        iss.run(prog)


@pytest.mark.parametrize("op, regs, match", [
    (VectorOp.LOAD_LUT, {"VU_LEN": 100}, r"LOAD_LUT with VU_LEN=100: must be 256"),
    (VectorOp.LOAD_LUT, {"VU_FLAGS": VecFlags(a_bytes=1).encode()},
     r"LOAD_LUT writes nothing: clear wr_data"),
    (VectorOp.LN, {"VU_LEN": 65}, r"LN with VU_LEN=65: must be in 1\.\.64"),
    (VectorOp.RMS, {"VU_LEN": 65}, r"RMS with VU_LEN=65: must be in 1\.\.64"),
    (VectorOp.RMS_APPLY, {"VU_SHIFT": 0}, r"RMS_APPLY with VU_SHIFT=0: must be in 1\.\.47"),
    (VectorOp.MUL, {"VU_SHIFT": 0}, r"MUL with VU_SHIFT=0: must be in 1\.\.47"),
    (VectorOp.REQUANT, {"VU_SHIFT": 0}, r"REQUANT with VU_SHIFT=0: must be in 1\.\.47"),
    (VectorOp.LN, {"VU_SHIFT": 48}, r"LN with VU_SHIFT=48: must be in 1\.\.47"),
])
def test_iss_rejects_op_limits(op, regs, match):
    base = {"VU_OP": int(op), "VU_ROWS": 1, "VU_LEN": 256 if op is VectorOp.LOAD_LUT else 4,
            "VU_N": 4, "VU_MULT": 1, "VU_SHIFT": 8, "VU_GSHIFT": 16,
            "VU_FLAGS": VecFlags(a_bytes=1, wr_data=op is not VectorOp.LOAD_LUT).encode()}
    iss, prog = _iss_with(dict(base, **regs))
    with pytest.raises(IssError, match=match):
        iss.run(prog)


def test_iss_rejects_per_channel_shift_and_short_write():
    iss = vector_iss(4)
    iss.write_words(10, pack_rows(pack_requant([1, 1, 1, 1], [8, 0, 8, 8])[None, :], 4, 4))
    launch = requant_launch(size=4, length=4, a=Rows(0, 1, 1, 1), out=Rows(20, 1, 1, 1),
                            params_base=10)
    with pytest.raises(IssError, match=r"per-channel shift 0 at row 0 element 1 outside"):
        iss.run(assemble(emit, [launch]))
    good = requant_launch(size=4, length=4, a=Rows(0, 1, 1, 1), out=Rows(20, 1, 1, 1),
                          mult=1, shift=1)
    short = dataclasses.replace(good, wr1=dataclasses.replace(good.wr1, n=(1, 2, 1, 1)))
    with pytest.raises(IssError, match=r"WR1 walks 2 addresses but the unit writes 1 words"):
        vector_iss(4).run(assemble(emit, [short]))
