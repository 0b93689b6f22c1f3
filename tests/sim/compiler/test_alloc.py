"""The allocator's regions (sim/compiler/alloc.py): the spare bank beside the transfer bank."""

import dataclasses

import pytest

from hw.spec import ConfigError, npu_preset
from sim.compiler.alloc import Allocator

TINY = npu_preset("tiny")          # 4 banks of 4,096 words


def bank(npu, t):
    return t.base // npu.bank_words, (t.base + t.words - 1) // npu.bank_words


def test_spare_transfer_and_top_are_three_banks():
    al = Allocator(TINY)
    top = al.alloc("x", 4, 4, 1, "activations")
    mid = al.alloc("p", 8, 4, 1, "activations", row_words_=1, transfer=True)
    spare = al.alloc("p1", 8, 4, 1, "activations", row_words_=1, spare=True)
    assert (bank(TINY, top), bank(TINY, mid), bank(TINY, spare)) == ((3, 3), (2, 2), (1, 1))
    assert spare.base + spare.words == 2 * TINY.bank_words
    assert al.next_word == top.words + mid.words + spare.words
    al.check_capacity()


def test_spare_and_transfer_share_the_top_region_below_three_banks():
    npu = dataclasses.replace(TINY, sram_banks=2)
    al = Allocator(npu)
    mid = al.alloc("p", 8, 4, 1, "activations", row_words_=1, transfer=True)
    spare = al.alloc("p1", 8, 4, 1, "activations", row_words_=1, spare=True)
    assert mid.base + mid.words == npu.sram_words and spare.base + spare.words == mid.base


def test_spare_falls_back_to_the_transfer_region_with_three_banks():
    npu = dataclasses.replace(TINY, sram_banks=3, sram_bytes=3 * 4 * 4096)
    al = Allocator(npu)
    mid = al.alloc("p", 8, 4, 1, "activations", row_words_=1, transfer=True)
    spare = al.alloc("p1", 8, 4, 1, "activations", row_words_=1, spare=True)
    assert spare.base + spare.words == mid.base


@pytest.mark.parametrize("where", ["low", "transfer"])
def test_a_full_spare_bank_is_refused(where):
    """The weights growing up into the spare region, or the transfer region growing down
    into it: the regions overlap."""
    al = Allocator(TINY)
    al.alloc("p1", 16, 4, 1, "activations", row_words_=1, spare=True)
    if where == "low":
        al.alloc("w", 2 * TINY.bank_words - 8, 4, 1, "weights", row_words_=1, low=True)
    else:
        al.alloc("p", TINY.bank_words + 8, 4, 1, "activations", row_words_=1, transfer=True)
    assert al.overflows
    with pytest.raises(ConfigError, match="regions overlap"):
        al.check_capacity()


def test_fallback_moves_up_instead_of_overlapping_the_weights():
    """Weights past the spare bank: a spare tensor with ``fallback`` goes to the transfer bank,
    and, that one full too, to the top."""
    al = Allocator(TINY)
    al.alloc("w", 2 * TINY.bank_words + 100, 4, 1, "weights", row_words_=1, low=True)
    spare = al.alloc("p1", 8, 4, 1, "activations", row_words_=1, spare=True, fallback=True)
    assert bank(TINY, spare) == (2, 2)
    big = al.alloc("p", TINY.bank_words, 4, 1, "activations", row_words_=1, transfer=True,
                   fallback=True)
    assert bank(TINY, big) == (3, 3)
    assert not al.overflows
