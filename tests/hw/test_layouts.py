"""Shared payload layouts (hw.layouts): the ring word rejects a size that is not whole lanes."""

import pytest

from hw.layouts import ring_word_layout


def test_word_layout_rejects_bad_size():
    with pytest.raises(ValueError, match=r"word_bytes must be a positive multiple of 4, not 6"):
        ring_word_layout(6)
