"""ChaCha8 PRG: the known answers of PROTOCOL.md section 2, pure and jitted forms alike."""

import struct

import numpy as np
import pytest

from morphogen.protocol import prg
from morphogen.protocol._chacha import g_words

VECTORS = [
    (bytes(16), "3e00ef2f895f40d67f5bb8e81f09a5a1", "2c840ec3ce9a7f3b181be188ef711a1e", 0, 0),
    (
        bytes(range(16)),
        "5cd42678f7d0ce4acbc573af6a2eea6b",
        "b34ba37416497417a183cc5bcfb96027",
        0,
        1,
    ),
]


@pytest.mark.parametrize("seed,left,right,tl,tr", VECTORS)
def test_expand_known_answers(seed, left, right, tl, tr):
    assert prg.expand(seed) == (bytes.fromhex(left), bytes.fromhex(right), tl, tr)


def test_chacha8_published_block():
    block = prg.chacha8_block((0, 0, 0, 0), 0)
    first32 = struct.pack("<8I", *block[:8]).hex()
    assert first32 == "3e00ef2f895f40d67f5bb8e81f09a5a12c840ec3ce9a7f3b181be188ef711a1e"


def test_expand_rejects_wrong_seed_length():
    with pytest.raises(ValueError):
        prg.expand(bytes(15))


def test_jitted_prg_matches_pure_python():
    rng = np.random.default_rng(3)
    for _ in range(50):
        seed = rng.bytes(16)
        w = struct.unpack("<4I", seed)
        out = g_words(*(np.uint32(x) for x in w))
        left, right, tl, tr = prg.expand(seed)
        assert struct.pack("<4I", *(int(x) for x in out[0:4])) == left
        assert struct.pack("<4I", *(int(x) for x in out[4:8])) == right
        assert (int(out[8]), int(out[9])) == (tl, tr)
