"""Drive the matmul unit with any M x K x N product (until the chip's sequencer does it).

The array computes ``size`` x ``size`` output tiles. :class:`MatmulJob` cuts ``C = A @ B`` into
tiles in row-major tile order (tile (mi, ni) after (mi, ni - 1)); each tile is one fold of K
beats: beat k carries A[mi*size : (mi+1)*size, k] and B[k, ni*size : (ni+1)*size], zero-padded at
the ragged edges. Padding rows and columns of the result are discarded by :meth:`assemble`.
The same beat lists feed Amaranth's simulator and the cocotb testbench.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hw.spec.formats import OutMode
from hw.tile.matmul import MatmulUnit

from .pysim import run_sim, send_all, stream_get

__all__ = ["MatmulJob", "simulate_pysim"]


@dataclass
class MatmulJob:
    a: np.ndarray            # [M, K] int8 (or 0..255 with a_unsigned)
    b: np.ndarray            # [K, N] int8
    size: int
    bias: np.ndarray | None = None    # [N] int32
    mult: np.ndarray | None = None    # [N] uint16
    shift: np.ndarray | None = None   # [N] 1..47
    mode: OutMode = OutMode.RAW
    a_unsigned: bool = False

    def __post_init__(self):
        self.a = np.asarray(self.a, dtype=np.int64)
        self.b = np.asarray(self.b, dtype=np.int64)
        if self.a.ndim != 2 or self.b.ndim != 2 or self.a.shape[1] != self.b.shape[0]:
            raise ValueError(f"shapes {self.a.shape} and {self.b.shape} do not chain")
        if self.a.shape[1] < 1:
            raise ValueError("K must be at least 1")
        n = self.b.shape[1]
        self.bias = np.zeros(n, np.int64) if self.bias is None else np.asarray(self.bias)
        self.mult = np.ones(n, np.int64) if self.mult is None else np.asarray(self.mult)
        self.shift = np.ones(n, np.int64) if self.shift is None else np.asarray(self.shift)
        self.mode = OutMode(self.mode)

    @property
    def shape(self):
        return self.a.shape[0], self.a.shape[1], self.b.shape[1]

    @property
    def tiles(self) -> list[tuple[int, int]]:
        m, _, n = self.shape
        s = self.size
        return [(mi, ni) for mi in range(-(-m // s)) for ni in range(-(-n // s))]

    def _pad(self, x, rows, cols):
        out = np.zeros((rows, cols), np.int64)
        out[:x.shape[0], :x.shape[1]] = x
        return out

    def a_beats(self) -> list[dict]:
        s, (_, k, _) = self.size, self.shape
        beats = []
        for mi, _ni in self.tiles:
            tile = self._pad(self.a[mi * s:(mi + 1) * s], s, k)
            # Lanes are raw bytes: 0..255 values travel as their two's-complement byte.
            tile = np.where(tile > 127, tile - 256, tile)
            for kk in range(k):
                beats.append({"data": [int(x) for x in tile[:, kk]],
                              "unsigned": int(self.a_unsigned), "last": int(kk == k - 1)})
        return beats

    def b_beats(self) -> list[dict]:
        s, (_, k, _) = self.size, self.shape
        beats = []
        for _mi, ni in self.tiles:
            tile = self._pad(self.b[:, ni * s:(ni + 1) * s], k, s)
            for kk in range(k):
                beats.append({"data": [int(x) for x in tile[kk]]})
        return beats

    def param_beats(self) -> list[dict]:
        s = self.size
        beats = []
        for _mi, ni in self.tiles:
            def col(v, ni=ni):
                seg = np.zeros(s, np.int64)
                part = v[ni * s:(ni + 1) * s]
                seg[:len(part)] = part
                # Padding columns get a harmless shift of 1 (1..47 is the legal range).
                if v is self.shift:
                    seg[len(part):] = 1
                return [int(x) for x in seg]
            beats.append({"bias": col(self.bias), "mult": col(self.mult),
                          "shift": col(self.shift), "mode": int(self.mode)})
        return beats

    @property
    def out_rows(self) -> int:
        return len(self.tiles) * self.size

    def assemble(self, rows: list[list[int]], lasts: list[int] | None = None) -> np.ndarray:
        """Crop the output rows (tile order) into the [M, N] result; check ``last`` flags."""
        s = self.size
        m, _, n = self.shape
        if len(rows) != self.out_rows:
            raise AssertionError(f"expected {self.out_rows} output rows, got {len(rows)}")
        if lasts is not None:
            for r, last in enumerate(lasts):
                want = int(r % s == s - 1)
                if last != want:
                    raise AssertionError(f"output row {r}: last={last}, expected {want}")
        out = np.zeros((-(-m // s) * s, -(-n // s) * s), np.int64)
        for t, (mi, ni) in enumerate(self.tiles):
            out[mi * s:(mi + 1) * s, ni * s:(ni + 1) * s] = np.array(rows[t * s:(t + 1) * s])
        return out[:m, :n]


def simulate_pysim(job: MatmulJob, *, rng: np.random.Generator | None = None, idle: float = 0.0,
                   stall: float = 0.0, max_cycles: int = 200_000, vcd: str | None = None,
                   pe_dsp: bool = False) -> dict:
    """Run ``job`` through :class:`hw.tile.matmul.MatmulUnit` in Amaranth's simulator.

    Random idle cycles on every input (probability ``idle``) and backpressure on the output
    (``stall``) come from ``rng``. Returns ``result`` ([M, N]), ``first_in`` / ``last_out`` (the
    cycles of the first input transfer and the last output transfer), ``cycles``
    (``last_out - first_in + 1``) and the simulator's speed. ``pe_dsp``: the unit's products
    as an FPGA build with DSPs takes them (:class:`hw.tile.matmul.MatmulArray`).
    """

    dut = MatmulUnit(size=job.size, pe_dsp=pe_dsp)
    rows, lasts, marks = [], [], {}

    async def put_a(ctx):
        await send_all(ctx, dut.i_a, job.a_beats(), rng=rng, idle=idle)

    async def put_b(ctx):
        await send_all(ctx, dut.i_b, job.b_beats(), rng=rng, idle=idle)

    async def put_param(ctx):
        await send_all(ctx, dut.i_param, job.param_beats(), rng=rng, idle=idle)

    async def get_o(ctx):
        for _ in range(job.out_rows):
            payload = await stream_get(ctx, dut.o, rng=rng, stall=stall)
            rows.append([int(x) for x in payload.data])
            lasts.append(int(payload.last))

    async def monitor(ctx):
        cycle = 0
        async for _clk, _rst, av, ar, ov, orr in ctx.tick().sample(
                dut.i_a.valid, dut.i_a.ready, dut.o.valid, dut.o.ready):
            if av and ar and "first_in" not in marks:
                marks["first_in"] = cycle
            if ov and orr:
                marks["last_out"] = cycle
            cycle += 1

    stats = run_sim(dut, [put_a, put_b, put_param, get_o], processes=[monitor],
                    max_cycles=max_cycles, vcd=vcd)
    return {"result": job.assemble(rows, lasts), "first_in": marks["first_in"],
            "last_out": marks["last_out"],
            "cycles": marks["last_out"] - marks["first_in"] + 1, **stats}
