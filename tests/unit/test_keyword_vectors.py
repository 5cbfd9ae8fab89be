"""The keyword tables' known answers (tests/vectors/keyword_tables.json), shared with the
TypeScript client: the project builds the same tables from the same choices, and its
verifying lookup reads the same values from the pages the file holds."""

import json
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from morphogen.constants import PAGE_SIZE
from morphogen.keyword.descriptor import KeywordIntegrityError
from morphogen.keyword.verify import descriptor_of
from tests.unit._kw import lookup
from tests.vectors import keyword_tables

VECTORS = json.loads(
    (Path(__file__).resolve().parents[1] / "vectors" / "keyword_tables.json").read_text())


def pages_of(v: dict) -> np.ndarray:
    pages = np.zeros((v["num_pages"], PAGE_SIZE), np.uint8)
    for i, h in v["pages"].items():
        raw = bytes.fromhex(h)
        pages[int(i), :len(raw)] = np.frombuffer(raw, np.uint8)
    return pages


def test_the_vectors_cover_a_private_level_both_layouts_and_an_anchor():
    assert VECTORS["deep"]["descriptor"]["levels"] == [3, 1]
    assert {v["descriptor"]["layout"] for v in VECTORS.values()} == {"page", "row"}
    assert VECTORS["row"]["descriptor"]["anchor"]["number"] == 21_000_000


@pytest.mark.parametrize("name", sorted(keyword_tables.CASES))
def test_the_project_rebuilds_the_same_table(name):
    assert keyword_tables.table(name) == VECTORS[name]


@pytest.mark.parametrize("name", sorted(keyword_tables.CASES))
@pytest.mark.parametrize("whole", [128, 1])
def test_lookups_in_the_file_s_pages(name, whole):
    v = VECTORS[name]
    pages = pages_of(v)
    owner = Ed25519PublicKey.from_public_bytes(bytes.fromhex(v["public_key"]))
    desc = descriptor_of(pages[-1].tobytes(), owner, v["num_pages"])
    keys = [bytes.fromhex(x["key"]) for x in v["lookups"]]
    got = lookup(pages, desc, keys, whole)
    assert [None if g is None else g.hex() for g in got] == [x["value"] for x in v["lookups"]]
    pages[desc.geometry.bucket_page(v["lookups"][0]["candidates"][0]), 100] ^= 1
    with pytest.raises(KeywordIntegrityError):
        lookup(pages, desc, keys, whole)
