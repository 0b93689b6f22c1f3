"""How a system's chips are connected: a 1-D ring or a 2-D torus, and each dimension's links.

Plain Python, no Amaranth: the spec, the compiler, the ISS, the timing models and the planner
size their chip ids and per-chip structures from a :class:`Topology` (``system_topology``), not
from a fixed chip count.

- A **ring** of N chips (``Topology.ring(N)``, dims ``(N,)``): chip i sends to chip i + 1 mod N,
  today's system.
- A **torus** X x Y (dims ``(X, Y)``): a ring along each dimension. Chip ``(x, y)`` has id
  ``y * X + x`` (:meth:`Topology.chip_at`), so a row ``y`` is the X consecutive ids from
  ``y * X`` and a column ``x`` the ids ``x, x + X, ...``. Dimension 0 (x, the rows' rings) is
  typically the on-board one, dimension 1 (y) the cabled one; each has its own link width
  and latency (:class:`DimLink`; absent: the NPU's ``link_bytes_per_cycle`` and
  ``link_latency_cycles``).

A system has at most :data:`MAX_CHIPS` chips; a chip id is :func:`chip_bits` bits. The
NPU TOML's optional ``[topology]`` table gives it (``docs/formats.md``)::

    [topology]
    dims = [4, 4]                       # X x Y; [N] or absent: a ring of --chips
    link_bytes_per_cycle = [64, 32]     # per dimension (optional)
    link_latency_cycles = [200, 800]    # per dimension (optional)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MAX_CHIPS", "DimLink", "Topology", "chip_bits", "parse_topology", "system_topology",
           "TOPOLOGY_KEYS"]

#: Chips in one system (a ring or a torus): chip ids are ``chip_bits(MAX_CHIPS)`` = 10 bits.
MAX_CHIPS = 1024
#: Keys of the NPU TOML's ``[topology]`` table.
TOPOLOGY_KEYS = ("dims", "link_bytes_per_cycle", "link_latency_cycles")


def chip_bits(chips: int) -> int:
    """Bits of a chip id in a system of ``chips`` chips (at least 1): the one rule every
    tag, register field and per-chip structure is sized by."""
    if not isinstance(chips, int) or isinstance(chips, bool) or chips < 1:
        raise ValueError(f"chips must be a positive integer, not {chips!r}")
    return max(1, (chips - 1).bit_length())


@dataclass(frozen=True)
class DimLink:
    """One dimension's links: ``bytes_per_cycle`` wide (a power of two), ``latency_cycles``
    pipeline registers (at least 1)."""

    bytes_per_cycle: int
    latency_cycles: int

    def __post_init__(self):
        b, a = self.bytes_per_cycle, self.latency_cycles
        if not isinstance(b, int) or isinstance(b, bool) or b < 1 or b & (b - 1):
            raise ValueError(f"link_bytes_per_cycle={b!r} must be a power of two (a ring word "
                             "is whole link flits)")
        if not isinstance(a, int) or isinstance(a, bool) or a < 1:
            raise ValueError(f"link_latency_cycles={a!r} must be an integer of at least 1")


@dataclass(frozen=True)
class Topology:
    """A ring (``dims = (N,)``) or a torus (``dims = (X, Y)``) of chips; ``links`` one
    :class:`DimLink` per dimension, or ``()`` for the NPU's link on every dimension."""

    dims: tuple[int, ...]
    links: tuple[DimLink, ...] = ()

    def __post_init__(self):
        dims = tuple(self.dims) if isinstance(self.dims, (list, tuple)) else self.dims
        if not isinstance(dims, tuple) or len(dims) not in (1, 2):
            raise ValueError(f"topology dims={self.dims!r} must be [N] (a ring) or [X, Y] "
                             "(a torus)")
        for d in dims:
            if not isinstance(d, int) or isinstance(d, bool) or d < 1:
                raise ValueError(f"topology dims={list(dims)} must be positive integers")
        if len(dims) == 2 and min(dims) < 2:
            raise ValueError(f"topology dims={list(dims)}: a torus needs at least 2 chips "
                             "along each dimension (a ring is dims=[N])")
        chips = 1
        for d in dims:
            chips *= d
        if chips > MAX_CHIPS:
            raise ValueError(f"topology {'x'.join(map(str, dims))} is {chips} chips: a system "
                             f"holds at most {MAX_CHIPS} (hw.spec.topology.MAX_CHIPS)")
        links = tuple(self.links)
        if links and len(links) != len(dims):
            raise ValueError(f"topology has {len(dims)} dimension(s) but {len(links)} link "
                             "descriptions (one per dimension)")
        for link in links:
            if not isinstance(link, DimLink):
                raise TypeError(f"topology links must be DimLink, not {link!r}")
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "links", links)

    @classmethod
    def ring(cls, chips: int) -> Topology:
        return cls((chips,))

    @property
    def chips(self) -> int:
        out = 1
        for d in self.dims:
            out *= d
        return out

    @property
    def is_torus(self) -> bool:
        return len(self.dims) == 2

    @property
    def chip_bits(self) -> int:
        return chip_bits(self.chips)

    def __str__(self):
        return "x".join(map(str, self.dims)) if self.is_torus else f"ring of {self.dims[0]}"

    def check_chip(self, chip: int, what: str = "chip") -> int:
        if not isinstance(chip, int) or isinstance(chip, bool) or not 0 <= chip < self.chips:
            raise ValueError(f"{what}={chip!r} is not a chip of the {self} "
                             f"(0..{self.chips - 1})")
        return chip

    def coords(self, chip: int) -> tuple[int, ...]:
        """``(x,)`` on a ring, ``(x, y)`` on a torus (chip = y * X + x)."""
        self.check_chip(chip)
        if not self.is_torus:
            return (chip,)
        return (chip % self.dims[0], chip // self.dims[0])

    def chip_at(self, *coords: int) -> int:
        if len(coords) != len(self.dims):
            raise ValueError(f"{len(coords)} coordinates for a {len(self.dims)}-D topology")
        for c, d in zip(coords, self.dims, strict=True):
            if not isinstance(c, int) or not 0 <= c < d:
                raise ValueError(f"coordinates {coords} outside {self}")
        return coords[0] if not self.is_torus else coords[1] * self.dims[0] + coords[0]

    def link(self, dim: int, npu) -> DimLink:
        """Dimension ``dim``'s links (the NPU's ``link_*`` when the topology gives none)."""
        if not 0 <= dim < len(self.dims):
            raise ValueError(f"dimension {dim} outside the {len(self.dims)}-D {self}")
        if self.links:
            return self.links[dim]
        return DimLink(npu.link_bytes_per_cycle, npu.link_latency_cycles)

    def row(self, y: int) -> tuple[int, ...]:
        """The chips of row ``y`` (dimension 0's ring), in ring order."""
        return tuple(self.chip_at(x, y) for x in range(self.dims[0]))

    def column(self, x: int) -> tuple[int, ...]:
        """The chips of column ``x`` (dimension 1's ring), in ring order."""
        return tuple(self.chip_at(x, y) for y in range(self.dims[1]))

    def ring_of(self, members) -> int | None:
        """The dimension whose one ring ``members`` (in group order) are, consecutive and
        whole or a run along it; None when they are not on one ring of the torus."""
        members = tuple(members)
        if not self.is_torus or len(members) < 2:
            return None
        coords = [self.coords(m) for m in members]
        for dim in (0, 1):
            other = 1 - dim
            if len({c[other] for c in coords}) == 1:
                n = self.dims[dim]
                steps = zip(coords, coords[1:], strict=False)
                if all((b[dim] - a[dim]) % n == 1 for a, b in steps):
                    return dim
        return None

    def group_links(self, members) -> str:
        """Which links a collective over ``members`` (in group order) runs on: ``"row y"`` or
        ``"column x"`` (one ring of the torus), ``"rows and columns"`` (routed over both),
        ``"the ring"``."""
        members = tuple(members)
        if not self.is_torus:
            return "the ring"
        dim = 0 if len(members) == 1 else self.ring_of(members)
        x, y = self.coords(members[0])
        return {0: f"row {y}", 1: f"column {x}", None: "rows and columns"}[dim]

    def route_links(self, src: int, dest: int) -> str:
        """The links a word from ``src`` to ``dest`` takes (dimension-order, the column first:
        ``hw.spec.ring.route_dim``): e.g. ``"column 1 (1 hop), row 3 (2 hops)"``."""
        hops = self.hops(src, dest)
        if not self.is_torus:
            return f"the ring ({hops[0]} hop{'s' if hops[0] != 1 else ''})"
        x, y2 = self.coords(src)[0], self.coords(dest)[1]
        legs = [(f"column {x}", hops[1]), (f"row {y2}", hops[0])]
        return ", ".join(f"{name} ({h} hop{'s' if h != 1 else ''})" for name, h in legs if h) \
            or "none"

    def hops(self, src: int, dest: int) -> tuple[int, ...]:
        """Hops along each dimension from ``src`` to ``dest`` (each ring runs one way)."""
        a, b = self.coords(src), self.coords(dest)
        return tuple((q - p) % d for p, q, d in zip(a, b, self.dims, strict=True))

    def to_json(self) -> dict:
        out = {"dims": list(self.dims)}
        if self.links:
            out["link_bytes_per_cycle"] = [link.bytes_per_cycle for link in self.links]
            out["link_latency_cycles"] = [link.latency_cycles for link in self.links]
        return out

    @classmethod
    def from_table(cls, table: dict) -> Topology:
        """From the NPU TOML's ``[topology]`` table; ``ValueError`` naming the bad key."""
        if not isinstance(table, dict):
            raise ValueError(f"topology must be a table, not {table!r}")
        unknown = sorted(set(table) - set(TOPOLOGY_KEYS))
        if unknown:
            raise ValueError(f"topology key {unknown[0]!r} is unknown; known keys are "
                             f"{', '.join(TOPOLOGY_KEYS)}")
        if "dims" not in table:
            raise ValueError("topology needs dims = [N] (a ring) or [X, Y] (a torus)")
        dims = table["dims"]
        if not isinstance(dims, list):
            raise ValueError(f"topology dims={dims!r} must be a list: [N] or [X, Y]")
        widths = table.get("link_bytes_per_cycle")
        lats = table.get("link_latency_cycles")
        if widths is None and lats is None:
            return cls(tuple(dims))
        if widths is None or lats is None:
            raise ValueError("topology needs both link_bytes_per_cycle and link_latency_cycles "
                             "(one per dimension), or neither")
        for key, v in (("link_bytes_per_cycle", widths), ("link_latency_cycles", lats)):
            if not isinstance(v, list) or len(v) != len(dims):
                raise ValueError(f"topology {key}={v!r} must list one value per dimension "
                                 f"({len(dims)})")
        return cls(tuple(dims), tuple(DimLink(b, a) for b, a in zip(widths, lats, strict=True)))


_SHAPE = re.compile(r"^\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?$")


def parse_topology(text: str) -> Topology:
    """``"16"`` (a ring of 16) or ``"4x4"`` (a torus); ``ValueError`` otherwise."""
    m = _SHAPE.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"topology {text!r} must be N (a ring) or XxY (a torus), e.g. 4x4")
    dims = tuple(int(g) for g in m.groups() if g is not None)
    return Topology(dims)


def system_topology(npu, chips: int) -> Topology:
    """The topology a system of ``chips`` chips of ``npu`` has: the NPU's ``[topology]`` when
    it gives one (which must have ``chips`` chips), else a ring of ``chips``. ``ValueError``
    when they disagree, or when a dimension's link width does not divide the chip's ring word
    (:attr:`hw.spec.NpuConfig.ring_word_bytes`: a word is whole flits on every link)."""
    topo = getattr(npu, "topology", None)
    if topo is None:
        return Topology.ring(chips)
    if topo.chips != chips:
        raise ValueError(f"chips={chips} is not the {topo.chips} chips of the topology {topo}")
    word = npu.ring_word_bytes
    for dim, link in enumerate(topo.links):
        if word % link.bytes_per_cycle:
            raise ValueError(f"topology link_bytes_per_cycle={link.bytes_per_cycle} (dimension "
                             f"{dim}) does not divide the chip's ring word of {word} bytes "
                             f"(max(2 * link_bytes_per_cycle, 8) of the NPU)")
    return topo
