"""`head_alive` is asked from the main thread while the stop's own thread shuts Ray down, which
removes the head's processes from the node's table as it kills them: a stop once ended in
"dictionary changed size during iteration" instead of exit code 0."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

worker = pytest.importorskip("ray._private.worker")

from cluster.local import head_alive  # noqa: E402


class _Proc:
    def __init__(self, table: dict, remove: str | None, code: int | None) -> None:
        self.table, self.remove, self.code = table, remove, code

    def poll(self) -> int | None:
        if self.remove is not None:  # what the stop's thread does meanwhile
            self.table.pop(self.remove, None)
        return self.code


def _node(codes: list[int | None]) -> SimpleNamespace:
    table: dict[str, list] = {}
    names = [f"p{i}" for i in range(len(codes))]
    for i, (name, code) in enumerate(zip(names, codes, strict=True)):
        later = names[i + 1] if i + 1 < len(names) else None
        table[name] = [SimpleNamespace(process=_Proc(table, later, code))]
    return SimpleNamespace(head=True, all_processes=table)


def test_processes_removed_while_looking_are_no_error(monkeypatch):
    monkeypatch.setattr(worker, "_global_node", _node([None, None, None]))
    assert head_alive() is True


def test_one_gone_process_means_the_head_is_going(monkeypatch):
    monkeypatch.setattr(worker, "_global_node", _node([None, 0]))
    assert head_alive() is False


def test_a_joined_cluster_has_nothing_to_watch(monkeypatch):
    monkeypatch.setattr(worker, "_global_node", None)
    assert head_alive() is True
