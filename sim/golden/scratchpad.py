"""Golden model of the address generators: the word addresses a descriptor walks."""

import numpy as np

from hw.spec.isa import ADDR_LEVELS

__all__ = ["addr_sequence", "AddressError"]


class AddressError(ValueError):
    """A descriptor walks an offset outside what its ``wrap`` can fold."""


def addr_sequence(base: int, n, s, addr_bits: int, wrap: int = 0, off: int = 0) -> np.ndarray:
    """Addresses ``base + sum(i_l * s_l)`` for the loop nest, innermost level 0 first.

    ``n`` and ``s`` have ``ADDR_LEVELS`` entries; a count of 0 counts as 1; addresses wrap
    modulo ``2**addr_bits``. With ``wrap`` = M > 0 the walk is a circular buffer of M words at
    ``base``: ``base + fold(off + sum(i_l * s_l))``, ``fold`` taking offsets modulo M, which the
    hardware does for offsets in ``[-M, 2M)`` (one add or subtract); others raise
    :class:`AddressError`. ``off`` is ignored when ``wrap`` is 0.
    """
    n = [max(1, int(x)) for x in n]
    s = [int(x) for x in s]
    if len(n) != ADDR_LEVELS or len(s) != ADDR_LEVELS:
        raise ValueError(f"n and s need {ADDR_LEVELS} entries")
    # Build outermost-first so that the flattened order has level 0 innermost.
    grids = np.ix_(*[np.arange(n[lv]) * s[lv] for lv in reversed(range(ADDR_LEVELS))])
    offset = np.full((1,), off if wrap else 0, dtype=np.int64)
    for g in grids:
        offset = offset + g
    offset = offset.reshape(-1)
    if wrap:
        if offset.min() < -wrap or offset.max() >= 2 * wrap:
            raise AddressError(f"offsets {offset.min()}..{offset.max()} are outside "
                               f"[-{wrap}, {2 * wrap}) that wrap={wrap} folds")
        offset = offset % wrap
    return ((base + offset) % (1 << addr_bits)).astype(np.int64)
