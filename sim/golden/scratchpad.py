"""Golden model of the address generators: the word addresses a descriptor walks."""

import numpy as np

from hw.spec.isa import ADDR_LEVELS

__all__ = ["addr_sequence"]


def addr_sequence(base: int, n, s, addr_bits: int) -> np.ndarray:
    """Addresses ``base + sum(i_l * s_l)`` for the loop nest, innermost level 0 first.

    ``n`` and ``s`` have ``ADDR_LEVELS`` entries; a count of 0 counts as 1; addresses wrap
    modulo ``2**addr_bits``.
    """
    n = [max(1, int(x)) for x in n]
    s = [int(x) for x in s]
    if len(n) != ADDR_LEVELS or len(s) != ADDR_LEVELS:
        raise ValueError(f"n and s need {ADDR_LEVELS} entries")
    addr = np.full((1,), base, dtype=np.int64)
    # Build outermost-first so that the flattened order has level 0 innermost.
    grids = np.ix_(*[np.arange(n[lv]) * s[lv] for lv in reversed(range(ADDR_LEVELS))])
    total = addr
    for g in grids:
        total = total + g
    return (total.reshape(-1) % (1 << addr_bits)).astype(np.int64)
