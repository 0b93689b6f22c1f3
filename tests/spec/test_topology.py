"""hw.spec.topology: a ring or a torus of up to 1,024 chips, from the NPU TOML or the CLI."""

import dataclasses

import pytest

from hw.spec import ConfigError, load_npu, npu_preset
from hw.spec.ring import NODE_CHIP_BITS, check_rtl_chips, route_dim, tag_bits
from hw.spec.topology import (
    MAX_CHIPS,
    DimLink,
    Topology,
    chip_bits,
    parse_topology,
    system_topology,
)
from tests.helpers import ROOT

TINY = npu_preset("tiny")


@pytest.mark.parametrize("chips, bits", [(1, 1), (2, 1), (3, 2), (8, 3), (9, 4), (16, 4),
                                         (256, 8), (257, 9), (1024, 10)])
def test_chip_bits_is_the_one_rule(chips, bits):
    assert chip_bits(chips) == bits, chips
    assert (1 << chip_bits(chips)) >= chips


def test_the_gateware_tag_comes_from_the_rule():
    """Chip ids (and the tags that carry two of them) are sized from the system: 3 bits for 8
    chips, 4 for a 4 x 4 torus, 10 for the node the Verilator backend builds for any."""
    assert chip_bits(8) == 3 and chip_bits(16) == 4 and tag_bits(4) == 10
    assert NODE_CHIP_BITS == chip_bits(MAX_CHIPS) == 10


def test_dimension_order_routing_goes_along_the_column_first():
    """On a 4 x 4 torus chip 5 (1, 1) sends a word for chip 6 (its row) along the row, a word
    for chip 13 (another row) along the column; a ring's chip sends every word along it."""
    row = (4, 7)
    assert route_dim(6, *row) == 0 and route_dim(4, *row) == 0
    assert route_dim(13, *row) == 1 and route_dim(1, *row) == 1
    assert all(route_dim(d, 0, 15) == 0 for d in range(16))


@pytest.mark.parametrize("text, dims, chips", [("16", (16,), 16), ("4x4", (4, 4), 16),
                                               ("32X32", (32, 32), 1024), (" 2 x 8 ", (2, 8), 16)])
def test_parse(text, dims, chips):
    topo = parse_topology(text)
    assert topo.dims == dims and topo.chips == chips
    assert topo.is_torus == (len(dims) == 2)


@pytest.mark.parametrize("make, match", [
    (lambda: parse_topology("4x"), r"topology '4x' must be N \(a ring\) or XxY"),
    (lambda: parse_topology("4x4x4"), r"must be N \(a ring\) or XxY"),
    (lambda: Topology((0,)), r"dims=\[0\] must be positive integers"),
    (lambda: Topology((1, 8)), r"a torus needs at least 2 chips along each dimension"),
    (lambda: Topology((64, 32)), r"64x32 is 2048 chips: a system holds at most 1024"),
    (lambda: Topology((1025,)), r"is 1025 chips: a system holds at most 1024"),
    (lambda: Topology((4, 4), (DimLink(4, 2),)), r"2 dimension\(s\) but 1 link"),
    (lambda: DimLink(3, 2), r"link_bytes_per_cycle=3 must be a power of two"),
    (lambda: DimLink(4, 0), r"link_latency_cycles=0 must be an integer of at least 1"),
    (lambda: chip_bits(0), r"chips must be a positive integer, not 0"),
])
def test_bad_topologies_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_coordinates_rows_and_columns():
    topo = Topology((4, 3))
    for chip in range(12):
        x, y = topo.coords(chip)
        assert chip == y * 4 + x == topo.chip_at(x, y), chip
    assert topo.row(1) == (4, 5, 6, 7)
    assert topo.column(2) == (2, 6, 10)
    assert topo.ring_of((4, 5, 6, 7)) == 0
    assert topo.ring_of((6, 7, 4)) == 0          # a run that wraps along its row
    assert topo.ring_of((1, 5, 9)) == 1
    assert topo.ring_of((3, 4)) is None          # the end of one row and the next's start
    assert topo.hops(1, 9) == (0, 2) and topo.hops(3, 0) == (1, 0) and topo.hops(0, 3) == (3, 0)
    with pytest.raises(ValueError, match=r"chip=12 is not a chip of the 4x3 \(0..11\)"):
        topo.coords(12)


def test_links_default_to_the_npu():
    assert Topology((4, 4)).link(1, TINY) == DimLink(TINY.link_bytes_per_cycle,
                                                     TINY.link_latency_cycles)
    assert Topology((4, 4), (DimLink(4, 2), DimLink(2, 9))).link(1, TINY) == DimLink(2, 9)


def test_system_topology():
    assert system_topology(TINY, 16) == Topology.ring(16)
    npu = dataclasses.replace(TINY, topology=Topology((4, 4)))
    assert system_topology(npu, 16).dims == (4, 4)
    with pytest.raises(ValueError, match=r"chips=8 is not the 16 chips of the topology 4x4"):
        system_topology(npu, 8)
    wide = dataclasses.replace(TINY, topology=Topology((2, 2), (DimLink(4, 2), DimLink(16, 2))))
    with pytest.raises(ValueError, match=r"link_bytes_per_cycle=16 \(dimension 1\) does not "
                                         r"divide the chip's ring word of 8 bytes"):
        system_topology(wide, 4)


def _npu_file(tmp_path, table):
    text = (ROOT / "constraints" / "npu" / "tiny.toml").read_text() + "\n[topology]\n" + table
    path = tmp_path / "torus.toml"
    path.write_text(text)
    return path


def test_the_npu_toml_gives_a_topology(tmp_path):
    npu = load_npu(_npu_file(tmp_path, "dims = [4, 2]\nlink_bytes_per_cycle = [4, 2]\n"
                                       "link_latency_cycles = [2, 30]\n"))
    assert npu.topology == Topology((4, 2), (DimLink(4, 2), DimLink(2, 30)))
    assert npu_preset("tiny").topology is None


@pytest.mark.parametrize("table, match", [
    ("dims = [4, 1]\n", r"topology=.* is not a topology: .*a torus needs at least 2 chips"),
    ("dims = 4\n", r"dims=4 must be a list"),
    ("size = [4]\n", r"topology key 'size' is unknown"),
    ("dims = [4, 4]\nlink_bytes_per_cycle = [4, 4]\n", r"needs both link_bytes_per_cycle and "
                                                       "link_latency_cycles"),
    ("dims = [4, 4]\nlink_bytes_per_cycle = [4]\nlink_latency_cycles = [2]\n",
     r"link_bytes_per_cycle=\[4\] must list one value per dimension \(2\)"),
])
def test_a_bad_topology_table_names_the_key_and_file(tmp_path, table, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_npu(_npu_file(tmp_path, table))
    assert info.value.key == "topology" and "torus.toml" in str(info.value)


def test_the_gateware_refuses_more_than_a_system_holds():
    assert check_rtl_chips(1024) == 1024
    with pytest.raises(ValueError, match=r"chips must be 1\.\.1024, not 1025: the gateware "
                                         "holds at most 1024"):
        check_rtl_chips(1025)
