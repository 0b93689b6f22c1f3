"""What several test modules share, written once: presets, CLI runners, NPU variants, stimulus,
stream glue and checks. Plain functions and constants; fixtures live in ``tests/conftest.py``."""

import dataclasses
import itertools
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.spec import PRESETS_DIR, ModelConfig, npu_preset
from hw.spec.attention import partial_row_words
from hw.spec.collective import CollectiveRequest, Kind
from hw.spec.isa import BUSY_COUNTERS, Op
from hw.spec.memory import pack_rows, row_words, unpack_rows
from hw.tile.vector_engine import VectorEngine
from sim import errors
from sim.cli import main
from sim.compiler.assembler import Assembler
from sim.compiler.attention_launch import (
    attention_launch,
    partial_launch,
    reduced_launch,
    state_launch,
    state_row_words,
)
from sim.compiler.attention_launch import emit as emit_attention
from sim.compiler.collective_launch import coll_launch
from sim.compiler.collective_launch import emit as emit_collective
from sim.golden.float_model import attention_mask, random_weights
from sim.golden.matmul import requant, wrap
from sim.golden.ring_softmax import chunked_attention
from sim.golden.scratchpad import addr_sequence
from sim.golden.softmax import softmax
from sim.iss import Iss
from sim.rtl.pysim import collect, run_sim, send_all
from sim.rtl.vector_engine_driver import run_vector_engine
from sim.timing.cycle import time_programs, trace_entries

ROOT = Path(__file__).resolve().parents[1]
TINY_NPU = str(PRESETS_DIR / "npu" / "tiny.toml")
TINY_MODEL = str(PRESETS_DIR / "models" / "tiny.toml")


def seeded(seed):
    """A generator for a fixed seed, printed so that a failure names it."""
    print(f"seed={seed}")
    return np.random.default_rng(seed)


# --- the npu command --------------------------------------------------------------------------

def run(capsys, *argv):
    """Run ``npu argv`` in-process; return (status, stdout, stderr)."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def run_process(*argv, timeout=60):
    """Run ``python -m sim argv`` as a real process from the repository root."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "sim", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def check_report(report, what):
    """A simulation report equals the golden model bit for bit and stays near float."""
    assert report.golden_match, f"{what}: first mismatch {report.first_mismatch}"
    assert report.cosine > 0.99, f"{what}: cosine {report.cosine}"


def assert_one_line(err, *fragments):
    assert err.endswith("\n") and err.count("\n") == 1, f"stderr is not one line: {err!r}"
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"


def assert_one_line_error(status, out, err, *fragments):
    """Exit status 2, nothing on stdout, one line on stderr carrying every fragment."""
    assert status == errors.EXIT_BAD_INPUT, f"exit status {status}, stderr {err!r}"
    assert out == "", f"stdout should be empty, got {out!r}"
    assert_one_line(err, *fragments)


def exported_verilog(tmp_path, top, npu):
    """`npu export --top top` for ``npu`` (a preset) into ``tmp_path``; the Verilog text."""
    assert main(["export", "--top", top, "--npu", str(npu.path), "-o", str(tmp_path)]) == 0
    return (tmp_path / f"npu_{top}.v").read_text()


class FlipFlop(wiring.Component):
    """The smallest top to register in ``hw.tops.TOPS``: one input, one registered output."""

    a: In(1)
    y: Out(1)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.y.eq(self.a)
        return m


# --- constraint files ---------------------------------------------------------------------------

def toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(value)


def write_toml(path, values):
    """Write a flat TOML table of ``values``; return ``path``."""
    path.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in values.items()))
    return path


def write_model(tmp_path, name="m.toml", **over):
    """A small model file (one pre-norm causal block of d_model 16 over 6 tokens), ``over``
    changing or adding keys; return its path as a string."""
    keys = {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_head": 8, "d_ff": 32, "seq_len": 6,
            "window": 0, "causal": True, "norm": "pre", **over}
    return str(write_toml(tmp_path / name, keys))


def outlier_model(cfg, seed):
    """Random weights and input (``seed``) with the outliers real encoders show: two residual
    channels and the LayerNorm gammas of the same channels scaled by 4 and 3 (outlier channels
    in every LayerNorm output), and per layer one FFN neuron with W1's column scaled by 8 and
    2 added to its bias (a massive activation). Returns ``(weights, x)``."""
    rng = seeded(seed)
    w = random_weights(cfg, seed)
    ch = rng.choice(cfg.d_model, 2, replace=False)
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        for ln in ("ln1", "ln2"):
            w[p + ln + ".weight"][ch] *= [4.0, 3.0]
        j = rng.integers(cfg.d_ff)
        w[p + "ffn.w1"][:, j] *= 8.0
        w[p + "ffn.b1"][j] += 2.0
    x = rng.standard_normal((cfg.seq_len, cfg.d_model))
    x[:, ch] *= [4.0, 3.0]
    return w, x


# --- NPU variants -------------------------------------------------------------------------------

def tiny_variant(**changes):
    """The tiny preset with ``changes``."""
    return dataclasses.replace(npu_preset("tiny"), **changes)


def small_npu():
    """The tiny preset with a 4 KiB scratchpad and 256 instruction words (chip, system)."""
    return tiny_variant(sram_bytes=4096, imem_words=256)


def square_npu(size, *, sram_words, **changes):
    """A ``size`` x ``size`` array, ``size`` vector lanes, ``sram_words`` words in 4 banks."""
    return tiny_variant(array_size=size, vector_lanes=size, sram_bytes=size * sram_words,
                        sram_banks=4, **changes)


#: Packed heads (heads narrower than a word, or not whole words, sharing words): models whose
#: d_head is not a multiple of the array, on the tiny NPU (4-lane words: 6-lane heads straddle
#: words) and on the tiny NPU with an 8-wide array (4-lane heads, two to a word). The Llama
#: variants add RoPE (rotated over tables of lcm(d_head, N) lanes; [Q|K|V] not ending on a
#: word, so the rotated projections are a matmul of their own), grouped-query attention (5
#: query heads on 1 K/V head), RMSNorm and SwiGLU; d_model and d_ff not whole words (weights
#: stored unpadded, the last column blocks packed).
PACKED_NPU8 = dataclasses.replace(npu_preset("tiny"), array_size=8, vector_lanes=8,
                                  sram_bytes=1 << 17, name="tiny8")
_LLAMA_KW = {"norm_kind": "rmsnorm", "activation": "silu", "ffn": "gated", "bias": False,
             "rope_theta": 10000.0}
PACKED6 = ModelConfig(n_layers=2, d_model=24, n_heads=4, d_head=6, d_ff=42, seq_len=8,
                      vocab_size=100, name="packed6")
PACKED6_LLAMA = ModelConfig(n_layers=2, d_model=30, n_heads=5, n_kv_heads=1, d_head=6,
                            d_ff=42, seq_len=8, vocab_size=100, name="packed6-llama",
                            **_LLAMA_KW)
PACKED4 = ModelConfig(n_layers=2, d_model=28, n_heads=7, d_head=4, d_ff=60, seq_len=8,
                      vocab_size=100, name="packed4")
PACKED4_LLAMA = ModelConfig(n_layers=2, d_model=20, n_heads=5, n_kv_heads=1, d_head=4,
                            d_ff=44, seq_len=8, vocab_size=100, name="packed4-llama",
                            **_LLAMA_KW)
#: (NPU, model) pairs of packed heads, by name.
PACKED = {"packed6": (npu_preset("tiny"), PACKED6),
          "packed6-llama": (npu_preset("tiny"), PACKED6_LLAMA),
          "packed4": (PACKED_NPU8, PACKED4),
          "packed4-llama": (PACKED_NPU8, PACKED4_LLAMA)}


def attention_npu(*, size=4, window=8, length=8, dmax=8, pipeline="short"):
    """A small attention engine's NPU: ring of ``window`` keys, softmax over ``length``, the
    engine's ``attention_pipeline``."""
    return square_npu(size, sram_words=1024, attn_window=window, softmax_len=length,
                      d_head_max=dmax, attention_pipeline=pipeline)


def vector_iss(size):
    """An ISS of a ``size``-lane chip with 512 scratchpad words (vector-engine cases)."""
    return Iss(square_npu(size, sram_words=512))


def vector_regs_program(regs, descs=None, size=4):
    """A ``size``-lane vector ISS and a program of one VEC launch with these registers and
    descriptors set as given (the ISS's checks of the registers)."""
    iss = vector_iss(size)
    asm = Assembler()
    for gen, d in (descs or {}).items():
        asm.set_desc(gen, d)
    for name, value in regs.items():
        asm.set(name, value)
    asm.launch(Op.VEC)
    asm.halt()
    return iss, asm.words()


def engine_equals_iss(iss, before, launches, rng, *, idle=0.25, stall=0.25, pipeline="short"):
    """Run ``launches`` on a VectorEngine (its ``pipeline``) from the memory ``before`` (random
    stalls) and check its memory equals the ISS's (which ran them); return the engine's
    cycles."""
    mem, cycles, _ = run_vector_engine(VectorEngine(lanes=iss.n, d_model_max=64,
                                                    pipeline=pipeline), before,
                                       launches, addr_bits=iss.addr_bits, rng=rng, idle=idle,
                                       stall=stall)
    diff = np.argwhere(mem != iss.mem)
    assert not len(diff), (f"RTL and ISS memories differ first at word {diff[0][0]} byte "
                           f"{diff[0][1]}: {mem[tuple(diff[0])]} vs {iss.mem[tuple(diff[0])]}")
    return cycles


def vector_size_rejections(min_lanes):
    """Bad ``lanes`` / ``d_model_max`` for a vector block of at least ``min_lanes`` lanes:
    ``(kwargs, error, match)`` for ``pytest.mark.parametrize``."""
    few = min_lanes - 1
    return [
        ({"lanes": 4.0, "d_model_max": 64}, TypeError, r"lanes must be an integer, not 4\.0"),
        ({"lanes": True, "d_model_max": 64}, TypeError, r"lanes must be an integer, not True"),
        ({"lanes": few, "d_model_max": 64}, ValueError,
         rf"lanes must be at least {min_lanes}, not {few}"),
        ({"lanes": 4, "d_model_max": "64"}, TypeError,
         r"d_model_max must be an integer, not '64'"),
        ({"lanes": 4, "d_model_max": 0}, ValueError, r"d_model_max must be in \[1, 65535\], not 0"),
        ({"lanes": 4, "d_model_max": 65536}, ValueError, r"d_model_max must be in .*not 65536"),
    ]


def matmul_operands(rng, m, k, n, *, a_unsigned=False):
    """Random A [m, k] (int8, or uint8 when ``a_unsigned``), B [k, n] int8, an int32 bias and a
    16-bit multiplier per column."""
    a = rng.integers(0, 256, (m, k)) if a_unsigned else rng.integers(-128, 128, (m, k))
    b = rng.integers(-128, 128, (k, n))
    bias = rng.integers(-2**31, 2**31, n)
    mult = rng.integers(0, 2**16, n)
    return a, b, bias, mult


# --- programs, memories and streams -------------------------------------------------------------

def assemble(emit, launches):
    """The program that emits each launch with ``emit(asm, launch)``, then halts."""
    asm = Assembler()
    for launch in launches:
        emit(asm, launch)
    asm.halt()
    return asm.words()


def single_chip_program(req, chip=0):
    """One COLL launch of ``req`` as ``chip`` (input at word 0, output at word 64), then HALT."""
    npu = small_npu()
    launch = coll_launch(req, chip, in_base=0, out_base=64, size=npu.array_size,
                         link_bytes=npu.link_bytes_per_cycle)
    return npu, launch, assemble(emit_collective, [launch])


def words_of(mem, desc, addr_bits):
    """The words an address-generator descriptor walks, in order."""
    return mem[addr_sequence(desc.base, desc.n, desc.s, addr_bits)]


def word_beat(word):
    """A scratchpad word as a stream beat of int8 lanes."""
    return {"data": [int(x) for x in word.view(np.int8)], "last": 0}


def byte_beat(payload):
    """A sampled beat of byte lanes as (bytes, last)."""
    return [int(x) & 0xFF for x in payload.data], int(payload.last)


def beat_rows(beats, width):
    """Stream beats ``{"data": [...], "last"}`` as one int64 row each: the lanes, then last."""
    if not beats:
        return np.zeros((0, width + 1), dtype=np.int64)
    return np.array([list(b["data"]) + [b["last"]] for b in beats], dtype=np.int64)


def assert_cycle_model(npu, programs, rtl, *, ring=None, topology=None):
    """The ISS's cycle model agrees with an RTL run of ``programs`` (``rtl``: per chip
    ``(cycles, busy counters, trace)``) on cycles, busy counters and every trace entry (on
    ``topology`` when given: a torus); returns the model's timing."""
    model = time_programs(npu, programs, ring=ring, topology=topology)
    for c, (chip, (cyc, busy, trace)) in enumerate(zip(model.chips, rtl, strict=True)):
        assert chip.cycles == cyc, f"chip {c}: {chip.cycles} cycles, RTL {cyc}"
        assert chip.busy == busy, \
            f"chip {c}: busy {dict(zip(BUSY_COUNTERS, chip.busy, strict=True))}, RTL " \
            f"{dict(zip(BUSY_COUNTERS, busy, strict=True))}"
        entries = trace_entries(npu, chip.trace)
        for k, (got, want) in enumerate(zip(entries["entries"], trace["entries"],
                                                   strict=False)):
            assert got == want, f"chip {c} trace entry {k}: {got}, RTL {want}"
        assert entries == trace
    return model


def assert_memories_equal(rtl, iss):
    diff = np.argwhere(rtl != iss)
    assert not len(diff), (f"RTL and ISS memories differ first at word {diff[0][0]} byte "
                           f"{diff[0][1]}: {rtl[tuple(diff[0])]} vs {iss[tuple(diff[0])]}")


def stream_through(dut, words, *, rng=None, idle=0.0, stall=0.0, convert=None, count=None,
                   processes=(), max_cycles=100_000):
    """Send ``words`` into ``dut.i`` and collect ``count`` (all) beats from ``dut.o``, with
    random idle and backpressure; return the collected beats."""
    got = []

    async def producer(ctx):
        await send_all(ctx, dut.i, words, rng=rng, idle=idle)

    async def consumer(ctx):
        got.extend(await collect(ctx, dut.o, len(words) if count is None else count, rng=rng,
                                 stall=stall, convert=convert))

    run_sim(dut, [producer, consumer], processes=processes, max_cycles=max_cycles)
    return got


# --- softmax rows -------------------------------------------------------------------------------

#: Score ranges drawn: full int16 (logits in +-128), then +-16, +-4 and +-1 logits.
SOFTMAX_SCALES = (32768, 4096, 1024, 256)


def random_rows(rng, rows: int, length: int):
    """Scores over several ranges (clipped to int16) and masks of random density per row, with
    some fully masked rows and some single-lane rows among them."""
    scale = rng.choice(SOFTMAX_SCALES, size=(rows, 1))
    scores = np.clip(rng.integers(-scale, scale, size=(rows, length)), -32768, 32767)
    mask = rng.random((rows, length)) < rng.random((rows, 1))
    return scores, mask


def edge_rows(length: int):
    """All-equal, dominant, widest range, masked lanes above the maximum, single lane, empty."""
    rows, masks = [], []
    full = np.ones(length, dtype=bool)

    def add(row, mask=full):
        rows.append(np.asarray(row, dtype=np.int64))
        masks.append(np.asarray(mask, dtype=bool))

    add(np.zeros(length))                                     # all equal
    add(np.full(length, 32767))
    add(np.full(length, -32768))
    add(np.where(np.arange(length) == 1, 4000, 0))            # one dominant score
    add(np.where(np.arange(length) % 2, 32767, -32768))       # widest dynamic range
    add(np.where(np.arange(length) == 0, 32767, -32768))
    add(np.where(np.arange(length) == length - 1, -32768, 32767))
    add(np.arange(length) * 64 - 512)                         # a ramp of 1/4 logit steps
    half = np.arange(length) < length // 2
    add(np.where(half, 0, 30000), half)                       # masked lanes far above the max
    add(np.full(length, 123), np.arange(length) == length - 1)  # single visible lane
    add(np.full(length, 5), np.zeros(length, dtype=bool))     # fully masked
    add(np.where(np.arange(length) == 0, 32767, 0), np.arange(length) != 0)
    return np.array(rows), np.array(masks)


# --- collectives --------------------------------------------------------------------------------

COLLECTIVE_KINDS = ("all_reduce", "reduce_scatter", "all_gather")
REDUCE_OPS = ("sum", "max", "min", "avg")


def collective_lengths(n):
    """Lengths 1, N-1, N+1 and a large odd one for a ring of ``n`` chips."""
    return sorted({1, max(1, n - 1), n + 1, 1001})


def requests_every_size(kind, width):
    """Requests of ``kind`` at ``width`` for N = 1..8, each of its lengths and every op."""
    for n in range(1, 9):
        for length, op in itertools.product(collective_lengths(n), REDUCE_OPS):
            yield CollectiveRequest(kind=kind, op=op, width=width, length=length, chips=n)


def input_length(req, chip):
    """How many elements ``chip`` brings to ``req``: its block for an all-gather (none outside
    the group), else the whole vector."""
    if req.kind != Kind.ALL_GATHER:
        return req.length
    p = req.position(chip)
    return 0 if p is None else req.blocks()[p]


def collective_inputs(rng, req, extremes=False):
    """Every chip's input of ``req``: uniform over the width, or only its extreme values."""
    dtype = np.int32 if req.width == 32 else np.int64
    info = np.iinfo(dtype)
    out = []
    for chip in range(req.chips):
        size = input_length(req, chip)
        if extremes:
            x = rng.choice(np.array([info.min, info.max, info.min + 1, info.max - 1, -1, 0, 1],
                                    dtype=dtype), size=size)
        else:
            x = rng.integers(info.min, info.max, size=size, dtype=dtype, endpoint=True)
        out.append(x)
    return out


def assert_chips_equal(got, want, what):
    """Per chip, element by element: ``got`` (arrays) equals ``want`` (lists of ints)."""
    assert len(got) == len(want), what
    for chip, (g, w) in enumerate(zip(got, want, strict=True)):
        g = [int(v) for v in g]
        assert len(g) == len(w), f"{what}: chip {chip} has {len(g)} elements, expected {len(w)}"
        for e, (a, b) in enumerate(zip(g, w, strict=True)):
            assert a == b, f"{what}: chip {chip} element {e}: {a} != {b}"


# --- one attention head in memory ---------------------------------------------------------------

SCORE_MULT, SCORE_SHIFT = 45000, 20     # q.k (std ~2**14) -> logits of std ~2.5 in Q8.8
OUT_MULT, OUT_SHIFT = 40000, 23         # raw P.V (p/256 x int8, up to 2**15) -> int8


def attention_reference(q, k, v, visible):
    """One head from a [queries, keys] visibility matrix, in the chip's integers (the scales
    above)."""
    raw = wrap(q @ k.T)
    scores = np.where(visible, requant(raw, SCORE_MULT, SCORE_SHIFT, 16), 0)
    probs = softmax(scores, visible).astype(np.int64)
    return requant(wrap(np.where(visible, probs, 0) @ v), OUT_MULT, OUT_SHIFT, 8)


def _qkv_in_memory(case, rng, npu, queries, keys, d_model):
    """Random int8 Q [queries, d_model], K and V [keys, d_model] written one row after another
    from word 0 of ``case``'s ISS (``case.npu``, ``case.iss``, ``case.rw`` the words of a row,
    ``case.q``, ``case.k``, ``case.v``, ``case.o_base`` the word after V); their bases."""
    n = npu.array_size
    case.npu, case.iss = npu, Iss(npu)
    case.rw = rw = row_words(d_model, 1, n)
    case.q = rng.integers(-128, 128, (queries, d_model))
    case.k = rng.integers(-128, 128, (keys, d_model))
    case.v = rng.integers(-128, 128, (keys, d_model))
    q_base, k_base = 0, queries * rw
    v_base = k_base + keys * rw
    case.o_base = v_base + keys * rw
    for base, x in ((q_base, case.q), (k_base, case.k), (v_base, case.v)):
        case.iss.write_words(base, pack_rows(x, 1, n))
    return q_base, k_base, v_base


def emit_transfers(asm, chip, transfers, npu):
    """``chip``'s SEND of words 0..15 to each transfer's destination and RECV into words
    40..55 from each transfer's source (``transfers``: (source, destination) pairs)."""
    from sim.compiler import p2p_launch as pl

    n, link = npu.array_size, npu.link_bytes_per_cycle
    for src, dest in transfers:
        if chip == src:
            pl.emit(asm, pl.send_launch(dest=dest, desc=pl.contiguous(0, 16), size=n,
                                        link_bytes=link))
        if chip == dest:
            pl.emit(asm, pl.recv_launch(src=src, desc=pl.contiguous(40, 16), size=n,
                                        link_bytes=link))


class AttentionCase:
    """Q [queries, d_model], K/V [keys, d_model] int8 in memory, one head's launch."""

    def __init__(self, rng, npu, *, queries, keys, d_model, col, d_head, **kw):
        n = npu.array_size
        q_base, k_base, v_base = _qkv_in_memory(self, rng, npu, queries, keys, d_model)
        rw = self.rw
        # Garbage in the output tensor: only the head's columns may change.
        self.garbage = rng.integers(-128, 128, (queries, d_model))
        self.iss.write_words(self.o_base, pack_rows(self.garbage, 1, n))
        self.launch = attention_launch(
            size=n, d_head=d_head, queries=queries, keys=keys, q_base=q_base, k_base=k_base,
            v_base=v_base, o_base=self.o_base, q_row_words=rw, k_row_words=rw, v_row_words=rw,
            o_row_words=rw, col=col, score_mult=SCORE_MULT, score_shift=SCORE_SHIFT,
            out_mult=OUT_MULT, out_shift=OUT_SHIFT, **kw)
        self.sl = slice(col, col + d_head)
        self.queries, self.d_model = queries, d_model
        self.before = self.iss.mem.copy()

    def run_iss(self, launches=None):
        self.iss.run(assemble(emit_attention, launches or [self.launch]))
        out = unpack_rows(self.iss.read_words(self.o_base, self.queries * self.rw),
                          self.queries, self.d_model, 1)
        if launches is None:
            untouched = np.ones(self.d_model, bool)
            untouched[self.sl] = False
            assert (out[:, untouched] == self.garbage[:, untouched]).all(), \
                "ISS wrote outside the head's columns"
            return out[:, self.sl]
        return out

    def check_against(self, got, want):
        bad = np.argwhere(got != want)
        assert not len(bad), (f"ISS query {bad[0][0]} lane {bad[0][1]}: {got[tuple(bad[0])]}, "
                              f"golden {want[tuple(bad[0])]}")


class SplitCase:
    """One head whose lanes are cut into ``shards`` (lane counts, multiples of N), as chips of
    a hidden-dimension split hold it: Q, K, V [*, d_model] int8 in memory, the head at column
    ``col``; per shard a partial launch (pass 1, rows at ``p_base[s]``) and a reduced launch
    (pass 2, the summed rows at ``r_base``, output at ``o_base``)."""

    def __init__(self, rng, npu, *, queries, keys, shards, d_model, col=0, q_pos=0, k_pos=0,
                 bidirectional=False, interleaved=False, halo=0, window=0):
        n = npu.array_size
        self.npu, self.iss = npu, Iss(npu)
        self.rw = rw = row_words(d_model, 1, n)
        self.prw = prw = partial_row_words(npu.attn_window, n)
        self.q = rng.integers(-128, 128, (queries, d_model))
        self.k = rng.integers(-128, 128, (keys, d_model))
        self.v = rng.integers(-128, 128, (keys, d_model))
        q_base, k_base, v_base = 0, queries * rw, (queries + keys) * rw
        self.o_base = v_base + keys * rw
        self.p_base = [self.o_base + queries * rw + s * queries * prw
                       for s in range(len(shards))]
        self.r_base = self.p_base[-1] + queries * prw
        for base, x in ((q_base, self.q), (k_base, self.k), (v_base, self.v)):
            self.iss.write_words(base, pack_rows(x, 1, n))
        self.queries, self.d_model, self.shards = queries, d_model, shards
        self.sl = slice(col, col + sum(shards))
        sched = {"q_pos": q_pos, "k_pos": k_pos, "bidirectional": bidirectional,
                 "interleaved": interleaved, "halo": halo}
        self.partials, self.reduced = [], []
        at = col
        for s, width in enumerate(shards):
            common = {"size": n, "window": npu.attn_window, "d_head": width,
                      "queries": queries, "keys": keys, "col": at, **sched}
            self.partials.append(partial_launch(q_base=q_base, k_base=k_base,
                                                p_base=self.p_base[s], q_row_words=rw,
                                                k_row_words=rw, **common))
            self.reduced.append(reduced_launch(
                v_base=v_base, r_base=self.r_base, o_base=self.o_base, v_row_words=rw,
                o_row_words=rw, window_cut=window, score_mult=SCORE_MULT,
                score_shift=SCORE_SHIFT, out_mult=OUT_MULT, out_shift=OUT_SHIFT, **common))
            at += width

    def partial_rows(self, s) -> np.ndarray:
        """Shard ``s``'s partial rows in the ISS's memory, int32 [queries, W]."""
        words = self.iss.read_words(self.p_base[s], self.queries * self.prw)
        rows = words.reshape(self.queries, -1)[:, :4 * self.npu.attn_window]
        return np.ascontiguousarray(rows).view("<i4").astype(np.int64)

    def reduce(self) -> np.ndarray:
        """Sum the shards' partial rows (wrapping, as the all-reduce does) into ``r_base``."""
        total = sum(self.partial_rows(s) for s in range(len(self.shards)))
        total = ((total + 2**31) % 2**32) - 2**31
        words = np.zeros((self.queries, self.prw * self.npu.array_size), np.uint8)
        words[:, :4 * self.npu.attn_window] = total.astype("<i4").view(np.uint8).reshape(
            self.queries, -1)
        self.iss.write_words(self.r_base, words.reshape(-1, self.npu.array_size))
        return total

    def output(self) -> np.ndarray:
        out = unpack_rows(self.iss.read_words(self.o_base, self.queries * self.rw),
                          self.queries, self.d_model, 1)
        return out[:, self.sl]


def state_case(seed, npu_kw, queries, chunks, kw, causal):
    """A :class:`StateCase` of ``queries`` queries over key ``chunks`` on an
    ``attention_npu(**npu_kw)`` (``kw``: d_head 8, col 0, d_model 8 unless given, ``q_pos``
    the first query's position), and its seeded generator. A causal query block runs its own
    chunk causal, the earlier ones bidirectional."""
    rng = seeded(seed)
    npu = attention_npu(**npu_kw)
    keys = chunks and max(b for _, b in chunks)
    kw = {"d_head": 8, "col": 0, "d_model": 8, **kw}
    q_pos = kw.pop("q_pos", 0)
    mask = attention_mask(keys, 0, causal)[q_pos:q_pos + queries] if causal else \
        np.ones((queries, keys), bool)
    own = [i for i, (a, b) in enumerate(chunks) if a <= q_pos < b] if causal else []
    case = StateCase(rng, npu, queries=queries, keys=keys, chunks=chunks, q_pos=q_pos,
                     causal=own, mask=mask, **kw)
    return case, rng


def program_layout(prog) -> list:
    """Per chip of a compiled program, its tensors' (name, category, base, words)."""
    return [[(t.name, t.category, t.base, t.words) for t in c.alloc.tensors.values()]
            for c in prog.chips]


def program_stream(prog) -> list:
    """Per chip, its instructions without the values SET writes (the data registers' values
    differ between a shapes-only compile and a real one)."""
    return [[(i.op, i.reg) if i.op == Op.SET else (i.op, i.reg, i.value)
             for i in c.asm.insns] for c in prog.chips]


class StateCase:
    """Long context: one head over key ``chunks`` (``[(start, stop), ...]`` of the keys, in
    merge order), one ``state_launch`` each (the first, middles, the last) for all the queries:
    Q, K, V [*, d_model] int8 in memory, the head's Q at column ``col`` (K, V at ``k_col``,
    ``v_col``), the state rows at ``s_base``, the output at ``o_base``. Query t is at position
    ``q_pos + t``, key j at ``k_pos + j``; ``mask`` [queries, keys] what the launches'
    positions make visible (for the golden). The chunks of ``causal`` (indices) run with the
    causal mask, the others bidirectional (a past chunk: every key visible)."""

    def __init__(self, rng, npu, *, queries, keys, chunks, d_model, col, d_head, k_col=None,
                 v_col=None, q_pos=0, k_pos=0, causal=(), window=0, mask):
        n = npu.array_size
        k_col = col if k_col is None else k_col
        v_col = col if v_col is None else v_col
        q_base, k_base, v_base = _qkv_in_memory(self, rng, npu, queries, keys, d_model)
        rw = self.rw
        self.s_base = self.o_base + queries * self.rw
        self.srw = state_row_words(d_head, col, n)
        self.garbage = rng.integers(-128, 128, (queries, d_model))
        self.iss.write_words(self.o_base, pack_rows(self.garbage, 1, n))
        # Garbage in the state rows too: the first launch must overwrite all of it.
        self.iss.write_words(self.s_base, rng.integers(0, 256, (queries * self.srw, n)))
        self.queries, self.d_model, self.chunks = queries, d_model, chunks
        self.sl = slice(col, col + d_head)
        self.launches = []
        for i, (a, b) in enumerate(chunks):
            mode = "first" if i == 0 else "last" if i == len(chunks) - 1 else "middle"
            self.launches.append(state_launch(
                mode=mode, size=n, d_head=d_head, queries=queries, keys=b - a,
                q_base=q_base, q_row_words=rw, col=col, k_base=k_base + a * rw,
                v_base=v_base + a * rw, k_row_words=rw, v_row_words=rw, k_col=k_col,
                v_col=v_col, s_base=self.s_base, o_base=self.o_base, o_row_words=rw,
                q_pos=q_pos, k_pos=k_pos + a, bidirectional=i not in causal, window=window,
                score_mult=SCORE_MULT, score_shift=SCORE_SHIFT, out_mult=OUT_MULT,
                out_shift=OUT_SHIFT))
        raw = wrap(self.q[:, col:col + d_head] @ self.k[:, k_col:k_col + d_head].T)
        scores = np.where(mask, requant(raw, SCORE_MULT, SCORE_SHIFT, 16), 0)
        self.want = chunked_attention(scores, mask, self.v[:, v_col:v_col + d_head],
                                      [(0, queries, list(chunks))], OUT_MULT, OUT_SHIFT)
        self.before = self.iss.mem.copy()

    def run_iss(self, launches=None):
        """Run the launches on the ISS; the head's output columns (the others must keep their
        garbage)."""
        self.iss.run(assemble(emit_attention, self.launches if launches is None else launches))
        out = unpack_rows(self.iss.read_words(self.o_base, self.queries * self.rw),
                          self.queries, self.d_model, 1)
        untouched = np.ones(self.d_model, bool)
        untouched[self.sl] = False
        assert (out[:, untouched] == self.garbage[:, untouched]).all(), \
            "ISS wrote outside the head's columns"
        return out[:, self.sl]


# --- sweeps -------------------------------------------------------------------------------------

def write_spec(path, values, overrides=None):
    """A sweep spec: ``values`` a value or a list each, ``overrides`` the [npu_overrides] table;
    return ``path`` as a string."""
    def item(v):
        return "[" + ", ".join(toml_value(x) for x in v) + "]" if isinstance(v, list) \
            else toml_value(v)
    text = "".join(f"{k} = {item(v)}\n" for k, v in values.items())
    if overrides is not None:
        text += "[npu_overrides]\n" + "".join(f"{k} = {item(v)}\n" for k, v in overrides.items())
    path.write_text(text)
    return str(path)


def comparable(rows):
    """Result rows without what differs from run to run (the wall-clock time)."""
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in rows]


def torus_programs(npu, topo, transfers, rng, *, length=16):
    """Programs on ``topo`` (a torus) where every row all-reduces ``length`` int32 (words 100..)
    on collective engine 0 while every column all-reduces another ``length`` (words 200..) on
    engine 1, and each ``(src, dest)`` of ``transfers`` sends 16 words from word 0 to word 40
    of ``dest``, all at the same time."""
    from hw.spec.collective import CollectiveRequest
    from hw.spec.isa import Unit
    from sim.compiler import collective_launch as cl
    from sim.compiler.assembler import Assembler

    n, link = npu.array_size, npu.link_bytes_per_cycle
    X, Y = topo.dims
    programs, images = [], []
    for c in range(topo.chips):
        x, y = topo.coords(c)
        asm = Assembler()
        images.append({0: rng.integers(0, 256, (16, n), dtype=np.uint8),
                       100: rng.integers(0, 256, (length, n), dtype=np.uint8),
                       200: rng.integers(0, 256, (length, n), dtype=np.uint8)})
        emit_transfers(asm, c, transfers, npu)
        row = CollectiveRequest("all_reduce", "sum", 32, length, topo.chips, first=y * X,
                                count=X)
        col = CollectiveRequest("all_reduce", "max", 32, length, topo.chips, first=x,
                                count=Y, stride=X)
        cl.emit(asm, cl.coll_launch_natural(row, c, base=100, size=n, link_bytes=link))
        cl.emit(asm, cl.coll_launch_natural(col, c, base=200, size=n, link_bytes=link,
                                            engine=1))
        asm.wait(Unit.ALL)
        asm.halt()
        programs.append(asm.words())
    return programs, images


def pairwise(*axes):
    """Every combination of the axes' values as ``pytest.param``\\ s, for a
    ``parametrize`` over the axes' names in order (a value that is a tuple fills several
    names). A subset in which every pair of values of two axes occurs at least once runs in
    the default suite; the rest of the full product is marked ``slow``. The subset is chosen
    greedily (the case covering most uncovered pairs first, ties to the earliest), so it does
    not change from run to run."""
    import pytest

    cases = list(itertools.product(*axes))

    def pairs(case):
        return {(i, case[i], j, case[j])
                for i, j in itertools.combinations(range(len(case)), 2)}

    need = set().union(*(pairs(c) for c in cases))
    default = set()
    while need:
        best = max(range(len(cases)), key=lambda k: (len(pairs(cases[k]) & need), -k))
        default.add(best)
        need -= pairs(cases[best])
    out = []
    for k, case in enumerate(cases):
        values = [v for axis in case for v in (axis if isinstance(axis, tuple) else (axis,))]
        out.append(pytest.param(*values, id=_case_id(values),
                                marks=() if k in default else (pytest.mark.slow,)))
    return out


def _case_id(values) -> str:
    """A test id from parameter values: a model's or an NPU's name, else the value."""
    return "-".join(str(getattr(v, "name", v)) for v in values)


def one_each(first, second):
    """``pytest.param``\\ s of ``first x second`` (each a list of values or of tuples that
    fill several names): each value of ``first`` with one value of ``second`` in turn in the
    default suite, so that every value of either occurs there; the rest marked ``slow``."""
    import pytest

    def flat(v):
        return v if isinstance(v, tuple) else (v,)

    return [pytest.param(*flat(a), *flat(b), id=_case_id(flat(a) + flat(b)),
                         marks=() if j == k % len(second) else (pytest.mark.slow,))
            for k, a in enumerate(first) for j, b in enumerate(second)]


async def load_and_start(ctx, dut, program):
    """Write ``program`` (instruction words) into a sequencer unit's instruction memory from
    address 0, one word a cycle, then pulse ``start``."""
    ctx.set(dut.imem_wr.valid, 1)
    for addr, word in enumerate(program):
        ctx.set(dut.imem_wr.payload, {"addr": addr, "data": word})
        await ctx.tick()
    ctx.set(dut.imem_wr.valid, 0)
    ctx.set(dut.start, 1)
    await ctx.tick()
    ctx.set(dut.start, 0)
