"""WordPacker and WordUnpacker (hw.tile.gearbox): narrow words to wide words and back."""

import pytest

from hw.tile.gearbox import WordPacker, WordUnpacker
from tests.helpers import seeded, stream_through


@pytest.mark.parametrize("ratio", [1, 2, 4])
def test_pack_then_unpack(ratio):
    rng = seeded(ratio)
    words = [int(w) for w in rng.integers(0, 1 << 16, 8 * ratio)]
    beats = [{"data": w, "last": int(k == len(words) - 1)} for k, w in enumerate(words)]
    wide = stream_through(WordPacker(narrow_bits=16, ratio=ratio), beats, rng=rng, idle=0.3,
                          stall=0.3, count=len(words) // ratio,
                          convert=lambda p: (int(p.data), int(p.last)))
    for k, (value, last) in enumerate(wide):
        parts = [(value >> (16 * j)) & 0xFFFF for j in range(ratio)]
        assert parts == words[k * ratio:(k + 1) * ratio], f"wide word {k}"
        assert last == int(k == len(wide) - 1), f"wide word {k}: last"
    narrow = stream_through(WordUnpacker(narrow_bits=16, ratio=ratio),
                            [{"data": v, "last": last} for v, last in wide], rng=rng, idle=0.3,
                            stall=0.3, count=len(words),
                            convert=lambda p: (int(p.data), int(p.last)))
    assert [v for v, _ in narrow] == words
    assert [last for _, last in narrow] == [0] * (len(words) - 1) + [1]


def test_rejections():
    with pytest.raises(TypeError, match="ratio must be an integer, not 1.5"):
        WordPacker(narrow_bits=8, ratio=1.5)
    with pytest.raises(ValueError, match="narrow_bits must be at least 1, not 0"):
        WordUnpacker(narrow_bits=0, ratio=2)
