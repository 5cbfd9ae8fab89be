"""The v1 format's known answers (tests/vectors/dpf_keys.json), shared with the TypeScript
client, against the spec client written from PROTOCOL.md apart from the project's code, and
against the project's key generation and evaluation."""

import json
from pathlib import Path

import pytest

from morphogen.protocol import prg
from morphogen.protocol.dpf import DpfKey, generate_keys, generate_keys_reference
from tests.integration import spec_client

VECTORS = json.loads(
    (Path(__file__).resolve().parents[1] / "vectors" / "dpf_keys.json").read_text())
FF = "ff" * 16


def _ids(v: dict) -> str:
    return f"d{v['domain_bits']}x{v['target']}"


def test_vectors_cover_both_ends_of_the_domain_range():
    assert {v["domain_bits"] for v in VECTORS["keys"]} >= {1, 4, 25, 32}
    assert VECTORS["prg"][0]["left"] == "3e00ef2f895f40d67f5bb8e81f09a5a1"  # PROTOCOL.md 2


@pytest.mark.parametrize("v", VECTORS["prg"], ids=lambda v: v["seed"][:8])
def test_prg(v):
    seed = bytes.fromhex(v["seed"])
    want = (v["left"], v["right"], v["t_left"], v["t_right"])
    for left, right, tl, tr in (prg.expand(seed), spec_client.prg(seed)):
        assert (left.hex(), right.hex(), tl, tr) == want


@pytest.mark.parametrize("v", VECTORS["keys"], ids=_ids)
def test_project_and_reference_make_the_vector(v):
    d, x = v["domain_bits"], v["target"]
    roots = tuple(bytes.fromhex(s) for s in v["seeds"])
    for gen in (generate_keys, generate_keys_reference):
        assert [k.to_bytes().hex() for k in gen(d, x, seeds=roots)] == v["keys"]


@pytest.mark.parametrize("v", VECTORS["keys"], ids=_ids)
def test_evaluations_and_point_function(v):
    keys = [DpfKey.from_bytes(bytes.fromhex(k)) for k in v["keys"]]
    for e in v["evals"]:
        masks = [k.eval(e["page"]).hex() for k in keys]
        assert masks == e["masks"]
        both = int(masks[0], 16) ^ int(masks[1], 16)
        assert f"{both:032x}" == (FF if e["page"] == v["target"] else "0" * 32)
