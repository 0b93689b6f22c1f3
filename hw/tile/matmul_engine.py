"""The matmul unit as the chip sees it: scratchpad words in, scratchpad words out.

Memory formats (``size`` = N = array size = bytes per scratchpad word):

- A operand: token-major int8 rows; the read port delivers, per fold, ``K/N`` blocks of N words
  (N rows of the tile, one column block each), which the :class:`Transposer` turns into K
  column beats. ``K`` must be a multiple of N.
- B operand: one word per beat, ``B[k, n0:n0+N]``, for the fold's first ``b_rows`` beats
  (``MM_B_ROWS``; 0: all K); the rest of the fold's beats take zero rows without reading a
  word, so a weight matrix of fewer rows than K (the A rows padded to whole words) is stored
  without its zero rows. With ``b_last`` = c (``MM_B_LAST``, 1..N; 0: off), the last column
  block of each row tile (fold ``b_blocks - 1`` of every ``b_blocks``, ``MM_B_BLOCKS``) holds
  only c columns, stored packed: its rows are c bytes each, one after another across words
  (``ceil(b_rows * c / N)`` words a fold), unpacked here into beats whose lanes past c are
  zero. So a weight matrix is stored unpadded in both dimensions
  (``hw.spec.memory.pack_weight_blocks``).
- Parameters: 7 words per fold (per output tile): ``bias`` int32 x N (4 words), ``mult`` uint16
  x N (2 words), ``shift`` uint8 x N (1 word), all little-endian, lane j at byte offset
  ``j * element bytes``.
- Output: each row of a tile is packed little-endian into 1 (INT8), 2 (INT16) or 4 (RAW, int32)
  words, lane j at byte offset ``j * element bytes``.
"""

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect

from ..layouts import spad_word_layout
from ..spec.formats import OutMode, out_words
from ..spec.isa import COUNT_BITS
from ..spec.memory import PARAM_WORDS
from .matmul import MatmulUnit
from .transpose import Transposer

__all__ = ["MatmulEngine", "cfg_layout"]


def cfg_layout(size):
    return data.StructLayout({
        "k": unsigned(COUNT_BITS),          # beats per fold, a multiple of N
        "folds": unsigned(COUNT_BITS),      # output tiles
        "mode": unsigned(2),                # OutMode
        "a_unsigned": 1,
        "b_rows": unsigned(COUNT_BITS),     # B rows read per fold (0: k)
        "b_blocks": unsigned(COUNT_BITS),   # column blocks per row tile (packed last block)
        "b_last": unsigned(size.bit_length()),   # its columns, packed (0: none)
    })


class MatmulEngine(wiring.Component):
    """Launch-configured wrapper of :class:`~hw.tile.matmul.MatmulUnit` for the chip.

    ``i_cfg`` starts one launch: ``folds`` output tiles of ``k`` beats each. ``busy`` is high
    from the configuration beat until the last output word has been taken.

    B rows past ``b_rows`` are zero and read no word; the packed last column block
    (``b_last``) is unpacked from a two-word window (the word being used and the next) by a
    byte shifter, so a beat never waits for more than one word. A whole-word fold takes its
    word straight from ``i_b`` as before: the timing of launches without ``b_rows`` and
    ``b_last`` is unchanged, and the packed ones move fewer B words, never more per beat.

    Members
    -------
    i_cfg : ``In(stream.Signature(cfg_layout()))``
    i_a, i_b, i_p : ``In(stream.Signature(spad_word_layout(size)))``: words from read ports
    o : ``Out(stream.Signature(spad_word_layout(size)))``: words to the write port, ``last`` on the
        launch's final word
    busy : ``Out(1)``

    ``pe_dsp``: the PEs' products in DSPs (:class:`~hw.tile.matmul.MatmulArray`).
    """

    def __init__(self, *, size, pe_dsp=False):
        if not isinstance(size, int) or isinstance(size, bool) or size < 2:
            raise ValueError(f"Array size must be an integer of at least 2, not {size!r}")
        self._size = size
        self._pe_dsp = bool(pe_dsp)
        super().__init__({
            "i_cfg": In(stream.Signature(cfg_layout(size))),
            "i_a": In(stream.Signature(spad_word_layout(size))),
            "i_b": In(stream.Signature(spad_word_layout(size))),
            "i_p": In(stream.Signature(spad_word_layout(size))),
            "o": Out(stream.Signature(spad_word_layout(size))),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        n = self._size
        m.submodules.unit = unit = MatmulUnit(size=n, pe_dsp=self._pe_dsp)
        m.submodules.transpose = tr = Transposer(size=n)
        cfg = Signal(cfg_layout(n))
        active = Signal()
        m.d.comb += self.busy.eq(active)

        m.d.comb += self.i_cfg.ready.eq(~active)
        with m.If(self.i_cfg.valid & self.i_cfg.ready):
            m.d.sync += [cfg.eq(self.i_cfg.payload), active.eq(1)]

        # A: words -> transposer -> beats, with the fold's `last` from a beat counter.
        connect(m, wiring.flipped(self.i_a), tr.i)
        accept = self.i_cfg.valid & self.i_cfg.ready
        # The counters' tests (the fold's last beat, a zero row, the packed column block) are
        # registers, each loaded with its value for the counter's next step, computed from
        # registers alone: what they gate (the beats' handshakes, and through them the array's
        # skew registers) starts at flip-flops, and the handshake only enables the load.
        par = self.i_cfg.payload
        beat = Signal(COUNT_BITS)
        a_last = Signal()                   # beat == k - 1
        zero = Signal()                     # beat >= kb: a zero B row
        kb = Mux(cfg.b_rows == 0, cfg.k, cfg.b_rows)
        m.d.comb += [
            unit.i_a.valid.eq(tr.o.valid & active),
            tr.o.ready.eq(unit.i_a.ready & active),
            unit.i_a.payload.data.eq(tr.o.payload.data),
            unit.i_a.payload.unsigned.eq(cfg.a_unsigned),
            unit.i_a.payload.last.eq(a_last),
        ]
        a_take = unit.i_a.valid & unit.i_a.ready
        with m.If(a_take):
            m.d.sync += [beat.eq(Mux(a_last, 0, beat + 1)),
                         a_last.eq(Mux(a_last, cfg.k == 1, beat + 2 == cfg.k)),
                         zero.eq(Mux(a_last, kb == 0, beat + 1 >= kb))]
        with m.If(accept):
            m.d.sync += [a_last.eq(beat == par.k - 1),
                         zero.eq(beat >= Mux(par.b_rows == 0, par.k, par.b_rows))]

        # B: a word is a beat; past b_rows a zero row (no word); in the packed last column
        # block, c bytes from the held word's unused bytes and then the next word's.
        fold_end = a_take & a_last
        blk = Signal(COUNT_BITS)            # column block of the fold (packed B)
        blk_last = Signal()                 # blk + 1 >= b_blocks: the row tile's last block
        hold = Signal(8 * n)                # the packed block's word in use
        held = Signal(range(n + 1))         # its bytes not yet used (0: none)
        c = cfg.b_last
        narrow = (c != 0) & blk_last
        need_word = ~zero & (~narrow | (held < c))
        used = Signal(range(n + 1))         # bytes of the held word already used
        m.d.comb += used.eq(n - held)
        window = Cat(hold, self.i_b.payload.data.as_value()) >> (used * 8)
        for j in range(n):
            lane = Mux(narrow, Mux(j < c, window[8 * j:8 * j + 8], 0),
                       self.i_b.payload.data[j])
            m.d.comb += unit.i_b.payload.data[j].eq(Mux(zero, 0, lane))
        m.d.comb += [
            unit.i_b.valid.eq((self.i_b.valid | ~need_word) & active),
            self.i_b.ready.eq(unit.i_b.ready & active & need_word),
        ]
        with m.If(unit.i_b.valid & unit.i_b.ready & narrow & ~zero):
            with m.If(need_word):
                m.d.sync += [hold.eq(self.i_b.payload.data.as_value()),
                             held.eq(n - (c - held))]
            with m.Else():
                m.d.sync += held.eq(held - c)
        with m.If(fold_end):
            # The block's last word's unused bytes are padding: the next fold starts afresh.
            m.d.sync += [held.eq(0), blk.eq(Mux(blk_last, 0, blk + 1)),
                         blk_last.eq(Mux(blk_last, cfg.b_blocks <= 1, blk + 2 >= cfg.b_blocks))]
        with m.If(accept):
            m.d.sync += [held.eq(0), blk.eq(0), blk_last.eq(par.b_blocks <= 1)]

        # Parameters: gather PARAM_WORDS words into one beat.
        pbuf = Signal(8 * n * PARAM_WORDS)
        pcount = Signal(range(PARAM_WORDS + 1))
        pfull = Signal()
        m.d.comb += [
            self.i_p.ready.eq(~pfull & active),
            unit.i_param.valid.eq(pfull),
            unit.i_param.payload.mode.eq(cfg.mode),
        ]
        word_bits = 8 * n
        for j in range(n):
            m.d.comb += [
                unit.i_param.payload.bias[j].eq(pbuf[32 * j:32 * j + 32]),
                unit.i_param.payload.mult[j].eq(pbuf[4 * word_bits + 16 * j:][:16]),
                unit.i_param.payload.shift[j].eq(pbuf[6 * word_bits + 8 * j:][:6]),
            ]
        with m.If(self.i_p.valid & self.i_p.ready):
            for w in range(PARAM_WORDS):
                with m.If(pcount == w):
                    m.d.sync += pbuf[w * word_bits:(w + 1) * word_bits].eq(
                        self.i_p.payload.data.as_value())
            with m.If(pcount == PARAM_WORDS - 1):
                m.d.sync += [pcount.eq(0), pfull.eq(1)]
            with m.Else():
                m.d.sync += pcount.eq(pcount + 1)
        with m.If(unit.i_param.valid & unit.i_param.ready):
            m.d.sync += pfull.eq(0)

        # Output: pack a row of int32 lanes into 1, 2 or 4 words, little-endian.
        row = unit.o.payload.data
        packed = {
            OutMode.INT8: Cat(*[row[j][:8] for j in range(n)]),
            OutMode.INT16: Cat(*[row[j][:16] for j in range(n)]),
            OutMode.RAW: Cat(*[row[j] for j in range(n)]),
        }
        part = Signal(2)
        with m.Switch(cfg.mode):
            for mode, bits in packed.items():
                with m.Case(mode):
                    with m.Switch(part):
                        for w in range(out_words(mode)):
                            with m.Case(w):
                                m.d.comb += self.o.payload.data.eq(
                                    bits[w * word_bits:(w + 1) * word_bits])
        # Whether the row's last word is on ``o`` (``part`` = words per row - 1): a register,
        # from ``part``'s next value and the next cycle's mode, so that the requantiser's
        # enable, fanned out to the whole array, is one LUT after flip-flops and ``o.ready``.
        part_next = Signal(2)
        mode_next = Mux(self.i_cfg.valid & self.i_cfg.ready, self.i_cfg.payload.mode, cfg.mode)
        row_done_next = Signal()
        # (No such mode, never emitted: no row ends.)
        with m.Switch(mode_next):
            for mode in packed:
                with m.Case(mode):
                    m.d.comb += row_done_next.eq(part_next == out_words(mode) - 1)
        row_done = Signal(init=out_words(OutMode(0)) == 1)   # cfg's reset mode, part 0
        m.d.comb += part_next.eq(part)
        m.d.sync += [part.eq(part_next), row_done.eq(row_done_next)]
        tile_row = Signal(range(n))
        fold = Signal(COUNT_BITS)
        final = (fold == cfg.folds - 1) & (tile_row == n - 1) & row_done
        m.d.comb += [
            self.o.valid.eq(unit.o.valid),
            self.o.payload.last.eq(final),
            unit.o.ready.eq(self.o.ready & row_done),
        ]
        with m.If(self.o.valid & self.o.ready):
            with m.If(row_done):
                m.d.comb += part_next.eq(0)
                with m.If(tile_row == n - 1):
                    m.d.sync += [tile_row.eq(0), fold.eq(fold + 1)]
                with m.Else():
                    m.d.sync += tile_row.eq(tile_row + 1)
            with m.Else():
                m.d.comb += part_next.eq(part + 1)
            with m.If(final):
                m.d.comb += part_next.eq(0)
                m.d.sync += [active.eq(0), fold.eq(0), tile_row.eq(0)]
        return m
