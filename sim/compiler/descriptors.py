"""Address-generator descriptors for each unit launch: the one place that knows the loops.

A descriptor is ``{"base": int, "n": [n0, n1, n2, n3], "s": [s0, s1, s2, s3]}`` in scratchpad
words; it walks ``base + sum(i_l * s_l)`` with level 0 innermost (``hw.tile.scratchpad.AddrGen``,
``sim.golden.scratchpad.addr_sequence``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hw.spec.formats import OutMode, out_words
from hw.spec.isa import Op
from hw.spec.memory import PARAM_WORDS

__all__ = ["Desc", "MatmulLaunch", "matmul_launch", "emit_matmul"]



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


def matmul_launch(*, size, m, k, n, a_base, a_row_words, b_base, p_base, c_base, c_row_words,
                  mode, a_unsigned=False) -> MatmulLaunch:
    """``C[m, n] = A[m, k] @ B[k, n]`` with the operands where the arguments say.

    ``m`` and ``k`` must be multiples of ``size`` (tensors are allocated padded); ``n`` is
    rounded up to whole column blocks. A is int8 token-major with ``a_row_words`` words per row;
    B is stored block-major: word ``b_base + nb*k + kk`` holds ``B[kk, nb*size:(nb+1)*size]``;
    parameters are ``PARAM_WORDS`` words per column block at ``p_base``; C rows have
    ``c_row_words`` words.
    """
    mode = OutMode(mode)
    if m % size or k % size:
        raise ValueError(f"m={m} and k={k} must be multiples of the array size {size}")
    mb, kb, nb = m // size, k // size, -(-n // size)
    ow = out_words(mode)
    if c_row_words < nb * ow:
        raise ValueError(f"c_row_words={c_row_words} cannot hold {nb} column blocks of {ow} "
                         f"words ({mode.name})")
    if a_row_words < kb:
        raise ValueError(f"a_row_words={a_row_words} cannot hold k={k} int8 columns")
    return MatmulLaunch(
        rd0=Desc(a_base, (size, kb, nb, mb), (a_row_words, 1, 0, size * a_row_words)),
        rd1=Desc(b_base, (k, nb, mb, 1), (1, k, 0, 0)),
        rd2=Desc(p_base, (PARAM_WORDS, nb, mb, 1), (1, PARAM_WORDS, 0, 0)),
        wr0=Desc(c_base, (ow, size, nb, mb), (1, c_row_words, ow, size * c_row_words)),
        k=k, folds=mb * nb, mode=mode, a_unsigned=bool(a_unsigned))


def emit_matmul(asm, launch: MatmulLaunch):
    """Append a launch's descriptors, its ``MM_*`` registers and ``MATMUL`` to ``asm``."""

    for gen in ("rd0", "rd1", "rd2", "wr0"):
        asm.set_desc(gen.upper(), getattr(launch, gen))
    asm.set("MM_K", launch.k)
    asm.set("MM_FOLDS", launch.folds)
    asm.set("MM_MODE", int(launch.mode))
    asm.set("MM_A_UNSIGNED", int(launch.a_unsigned))
    asm.launch(Op.MATMUL)
