"""An owner process killed (SIGKILL: no cleanup, nothing flushed) in the middle of applying a
block to its mapped pages and key index: after some changes were written in place, after all
of them but before the version is written, and after the pointer moved but before the working
files are marked whole. The next process reads exactly the last version the pointer names,
pages and keys, and applies the same changes again to the same result as an apply that was
never interrupted."""

from __future__ import annotations

import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from morphogen.keyword import build_table
from morphogen.keyword.owner import Change, OwnerTable, create_owner_dir

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
REPO = Path(__file__).resolve().parents[2]

# the child applies the changes with the owner's pages and keys mapped, and kills itself at
# the named point
CHILD = r"""
import os, pickle, signal, sys
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from morphogen.keyword import editor, versions, working
from morphogen.keyword.owner import OwnerTable

root, changes_file, point = sys.argv[1], sys.argv[2], sys.argv[3]
changes = pickle.loads(open(changes_file, "rb").read())

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if point == "mid-edits":
    apply, seen = editor.Editor.apply, [0]
    def killing_apply(self, change):
        seen[0] += 1
        if seen[0] == len(changes) // 2:
            die()
        return apply(self, change)
    editor.Editor.apply = killing_apply
elif point == "before-version":
    def killing_write(self, *a, **k):
        die()
    versions.VersionStore.write = killing_write
elif point == "before-clean-mark":
    mark = working.mark
    def killing_mark(root, version, *, clean):
        if clean:
            die()
        return mark(root, version, clean=clean)
    working.mark = killing_mark
owner = OwnerTable(root)
owner.map_working_pages()
owner.apply(changes, Ed25519PrivateKey.from_private_bytes(bytes(range(32))),
            rng=lambda n: 0)
"""


def _setup(tmp_path: Path) -> tuple[Path, list[Change]]:
    rng = random.Random(7)
    recs = {rng.randbytes(20): rng.randbytes(32) for _ in range(2500)}
    table = build_table(recs.items(), value_size=32, signing_key=KEY, load=0.7)
    root = tmp_path / "o"
    create_owner_dir(table, root)
    owner = OwnerTable(root)
    owner.map_working_pages()
    # a version before the one killed: the working files are then not version 1's copy
    owner.apply([Change("put", rng.randbytes(20), rng.randbytes(32)) for _ in range(30)], KEY,
                rng=lambda n: 0)
    owner.wait_checkpoints()
    changes = [Change("put", rng.randbytes(20), rng.randbytes(32)) for _ in range(40)]
    changes += [Change("put", k, rng.randbytes(32)) for k in rng.sample(sorted(recs), 40)]
    changes += [Change("delete", k) for k in rng.sample(sorted(recs), 10)]
    return root, changes


@pytest.mark.parametrize("point", ["mid-edits", "before-version", "before-clean-mark"])
def test_an_owner_killed_mid_apply_reads_and_applies_as_one_never_killed(tmp_path: Path,
                                                                         point: str) -> None:
    root, changes = _setup(tmp_path)
    reference = tmp_path / "reference"
    subprocess.run(["cp", "-a", str(root), str(reference)], check=True)
    before = OwnerTable(root).current
    (tmp_path / "changes.pickle").write_bytes(pickle.dumps(changes))
    child = subprocess.run([sys.executable, "-c", CHILD, str(root),
                            str(tmp_path / "changes.pickle"), point],
                           env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -9, child.stderr
    owner = OwnerTable(root)
    owner.map_working_pages()
    moved = point == "before-clean-mark"  # the version was written and the pointer moved
    assert owner.current == before + (1 if moved else 0)
    # the mapped pages and keys are the pointer's version, not what the killed run left
    assert (owner.pages() == owner.store.pages(owner.current)).all()
    assert owner.keys() == owner.store.keys(owner.current)
    if not moved:
        owner.apply(changes, KEY, rng=lambda n: 0)
    never_killed = OwnerTable(reference)
    never_killed.map_working_pages()
    never_killed.apply(changes, KEY, rng=lambda n: 0)
    assert owner.current == never_killed.current
    assert owner.keys() == never_killed.keys()
    assert owner.records() == never_killed.records()
