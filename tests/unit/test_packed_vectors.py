"""The packed format's known answers (tests/vectors/packed_keys.json) against the spec client's
evaluator, written from docs/packed-keys.md apart from the project's code, and against the
project's key generation and evaluation."""

import json
from pathlib import Path

import numpy as np
import pytest

from morphogen.protocol.packed import PackedKey, generate_packed_keys, selection_range
from tests.integration import spec_client

VECTORS = json.loads(
    (Path(__file__).resolve().parents[1] / "vectors" / "packed_keys.json").read_text())


def _bits(leaves: list[str]) -> np.ndarray:
    raw = np.frombuffer(bytes.fromhex("".join(leaves)), np.uint8)
    return np.unpackbits(raw, bitorder="little")


def test_vectors_cover_small_and_tree_domains():
    assert {v["domain_bits"] for v in VECTORS} >= {1, 7, 8, 12}


@pytest.mark.parametrize("v", VECTORS, ids=lambda v: f"d{v['domain_bits']}x{v['target']}")
def test_spec_evaluator_checks_the_vector(v):
    d, x = v["domain_bits"], v["target"]
    roots = tuple(bytes.fromhex(s) for s in v["seeds"])
    keys = [bytes.fromhex(k) for k in v["keys"]]
    assert list(spec_client.packed_keygen(d, x, roots)) == keys
    for key, leaves in zip(keys, v["leaves"], strict=True):
        assert [spec_client.packed_leaf(key, j).hex() for j in range(len(leaves))] == leaves
    diff = _bits(v["leaves"][0]) ^ _bits(v["leaves"][1])
    assert np.flatnonzero(diff).tolist() == [x]
    for p in {0, x, (1 << d) - 1}:
        assert spec_client.packed_bit(keys[0], p) ^ spec_client.packed_bit(keys[1], p) == (p == x)


@pytest.mark.parametrize("v", VECTORS, ids=lambda v: f"d{v['domain_bits']}x{v['target']}")
def test_project_reproduces_the_vector(v):
    d, x = v["domain_bits"], v["target"]
    roots = tuple(bytes.fromhex(s) for s in v["seeds"])
    made = generate_packed_keys(d, x, seeds=roots)
    assert [k.to_bytes().hex() for k in made] == v["keys"]
    for hexkey, leaves in zip(v["keys"], v["leaves"], strict=True):
        key = PackedKey.from_bytes(bytes.fromhex(hexkey))
        want = _bits(leaves)[: 1 << d]
        assert np.array_equal(selection_range(key, 0, 1 << d), want)
