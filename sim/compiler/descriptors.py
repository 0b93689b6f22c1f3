"""Address-generator descriptors for each unit launch: the one place that knows the loops.

A descriptor is ``{"base": int, "n": [n0, n1, n2, n3], "s": [s0, s1, s2, s3]}`` in scratchpad
words; it walks ``base + sum(i_l * s_l)`` with level 0 innermost (``hw.tile.scratchpad.AddrGen``,
``sim.golden.scratchpad.addr_sequence``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hw.spec.formats import OutMode, out_words
from hw.spec.isa import MAX_COUNT, Op
from hw.spec.memory import PARAM_WORDS, packed_block_words

__all__ = ["Desc", "MatmulLaunch", "matmul_launch", "matmul_launches", "b_walk", "emit_matmul"]



@dataclass(frozen=True)
class Desc:
    """An address-generator descriptor; ``wrap`` and ``off`` only for ``WRAP_GENS``
    (``hw.spec.isa``): a circular buffer of ``wrap`` words at ``base``, starting at ``off``."""

    base: int
    n: tuple
    s: tuple
    wrap: int = 0
    off: int = 0

    def as_dict(self):
        return {"base": self.base, "n": list(self.n), "s": list(self.s), "wrap": self.wrap,
                "off": self.off}

    @property
    def total(self):
        out = 1
        for x in self.n:
            out *= max(1, x)
        return out


@dataclass(frozen=True)
class MatmulLaunch:
    rd0: Desc   # A rows, in N x N blocks for the transposer
    rd1: Desc   # B
    rd2: Desc   # per-fold parameters
    wr0: Desc   # C rows
    k: int
    folds: int
    mode: OutMode
    a_unsigned: bool
    b_rows: int = 0      # MM_B_ROWS: B rows stored per fold (0: k)
    b_blocks: int = 0    # MM_B_BLOCKS: column blocks per row tile (with b_last)
    b_last: int = 0      # MM_B_LAST: columns of the packed last block (0: none)


def _factor(total: int) -> tuple[int, int] | None:
    """``(n0, n1)`` with ``n0 * n1 == total``, both at most a generator count (n0 the
    largest such), or None."""
    if total <= MAX_COUNT:
        return total, 1
    for n1 in range(-(-total // MAX_COUNT), MAX_COUNT + 1):
        if total % n1 == 0:
            return total // n1, n1
    return None


def b_walk(*, size, k_rows, cols, packed) -> tuple[int, int, int] | None:
    """How the B words of one row tile lie: ``(words, b_blocks, b_last)``: ``words`` per row
    tile (``k_rows`` per whole block; with ``packed`` the last block of ``cols mod size``
    columns in ``ceil(k_rows c / N)`` words)."""
    nb, last = -(-cols // size), cols % size if packed else 0
    words = (nb - 1) * k_rows + packed_block_words(k_rows, last, size) if last else nb * k_rows
    return words, nb, last


def matmul_launch(*, size, m, k, n, a_base, a_row_words, b_base, p_base, c_base, c_row_words,
                  mode, a_unsigned=False, b_rows=None, packed=False) -> MatmulLaunch:
    """``C[m, n] = A[m, k] @ B[k, n]`` with the operands where the arguments say.

    ``m`` and ``k`` must be multiples of ``size`` (tensors are allocated padded); ``n`` is
    rounded up to whole column blocks. A is int8 token-major with ``a_row_words`` words per row;
    B is stored block-major: word ``b_base + nb*kr + kk`` holds ``B[kk, nb*size:(nb+1)*size]``
    for its ``kr = b_rows`` (default ``k``) stored rows (the rest of the k beats take zero
    rows: ``MM_B_ROWS``); with ``packed`` the last block of ``n mod size`` columns is stored
    packed (``hw.spec.memory.pack_weight_blocks``, ``MM_B_LAST``). Parameters are
    ``PARAM_WORDS`` words per column block at ``p_base``; C rows have ``c_row_words`` words.
    ValueError when a packed B of more than 65535 words per row tile has no two-level walk
    (:func:`matmul_launches` splits it).
    """
    mode = OutMode(mode)
    if m % size or k % size:
        raise ValueError(f"m={m} and k={k} must be multiples of the array size {size}")
    mb, kw, nb = m // size, k // size, -(-n // size)
    kr = k if b_rows is None else b_rows
    if not 1 <= kr <= k:
        raise ValueError(f"b_rows={kr} must be 1..k={k}")
    ow = out_words(mode)
    if c_row_words < nb * ow:
        raise ValueError(f"c_row_words={c_row_words} cannot hold {nb} column blocks of {ow} "
                         f"words ({mode.name})")
    if a_row_words < kw:
        raise ValueError(f"a_row_words={a_row_words} cannot hold k={k} int8 columns")
    words, _, last = b_walk(size=size, k_rows=kr, cols=n, packed=packed)
    if last:
        split = _factor(words)
        if split is None:
            raise ValueError(f"a packed B of {words} words per row tile has no walk of two "
                             f"16-bit counts")
        rd1 = Desc(b_base, (split[0], split[1], mb, 1), (1, split[0], 0, 0))
    else:
        rd1 = Desc(b_base, (kr, nb, mb, 1), (1, kr, 0, 0))
    return MatmulLaunch(
        rd0=Desc(a_base, (size, kw, nb, mb), (a_row_words, 1, 0, size * a_row_words)),
        rd1=rd1,
        rd2=Desc(p_base, (PARAM_WORDS, nb, mb, 1), (1, PARAM_WORDS, 0, 0)),
        wr0=Desc(c_base, (ow, size, nb, mb), (1, c_row_words, ow, size * c_row_words)),
        k=k, folds=mb * nb, mode=mode, a_unsigned=bool(a_unsigned),
        b_rows=0 if kr == k else kr, b_blocks=nb if last else 0, b_last=last)


def matmul_launches(*, size, n, b_base, p_base, c_base, mode, b_rows=None, k,
                    packed=False, **kw) -> list[MatmulLaunch]:
    """:func:`matmul_launch`, or, when its packed B has no two-level walk, two launches: the
    whole column blocks, then the packed last block alone (its B words, parameters and output
    columns where the single launch would have them)."""
    try:
        return [matmul_launch(size=size, n=n, b_base=b_base, p_base=p_base, c_base=c_base,
                              mode=mode, b_rows=b_rows, k=k, packed=packed, **kw)]
    except ValueError:
        if not packed or not n % size:
            raise
    full = n // size
    kr = k if b_rows is None else b_rows
    ow = out_words(OutMode(mode))
    return [matmul_launch(size=size, n=full * size, b_base=b_base, p_base=p_base,
                          c_base=c_base, mode=mode, b_rows=b_rows, k=k, **kw),
            matmul_launch(size=size, n=n - full * size, b_base=b_base + full * kr,
                          p_base=p_base + full * PARAM_WORDS, c_base=c_base + full * ow,
                          mode=mode, b_rows=b_rows, k=k, packed=True, **kw)]


def emit_matmul(asm, launch: MatmulLaunch):
    """Append a launch's descriptors, its ``MM_*`` registers and ``MATMUL`` to ``asm``."""

    for gen in ("rd0", "rd1", "rd2", "wr0"):
        asm.set_desc(gen.upper(), getattr(launch, gen))
    asm.set("MM_K", launch.k)
    asm.set("MM_FOLDS", launch.folds)
    asm.set("MM_MODE", int(launch.mode))
    asm.set("MM_A_UNSIGNED", int(launch.a_unsigned))
    asm.set("MM_B_ROWS", launch.b_rows)
    asm.set("MM_B_BLOCKS", launch.b_blocks)
    asm.set("MM_B_LAST", launch.b_last)
    asm.launch(Op.MATMUL)
