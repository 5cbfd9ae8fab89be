"""Advice to the kernel on a mapping's pages (`morphogen.storage.advice`): runs of consecutive
pages, a call at a time until stopped, a refusal reported, and no byte of the file changed."""

from __future__ import annotations

import mmap
import threading
from pathlib import Path

import numpy as np

from morphogen.constants import PAGE_SIZE
from morphogen.storage import advice


def test_runs_are_the_consecutive_pages() -> None:
    first, lengths = advice.runs(np.array([0, 1, 2, 7, 9, 10, 40]))
    assert first.tolist() == [0, 7, 9, 40] and lengths.tolist() == [3, 1, 2, 1]
    first, lengths = advice.runs(np.zeros(0, np.int64))
    assert len(first) == len(lengths) == 0


def test_advice_on_a_real_mapping_changes_no_byte(tmp_path: Path) -> None:
    path = tmp_path / "pages.bin"
    data = np.random.default_rng(3).integers(0, 256, 64 * PAGE_SIZE, np.uint8)
    path.write_bytes(data.tobytes())
    with path.open("r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        view = np.frombuffer(mm, np.uint8)
        which = np.array([0, 1, 2, 30, 63])
        assert advice.advise(view.ctypes.data, which, advice.WILLNEED)
        # populating writable is Linux 5.14's; an older kernel refuses it, and says so
        assert advice.advise(view.ctypes.data, which, advice.POPULATE_WRITE) in (True, False)
        assert not advice.advise(view.ctypes.data, which, 12345)  # no such advice: refused
        assert view.tobytes() == data.tobytes()
        del view
    assert path.read_bytes() == data.tobytes()


def test_a_stop_ends_it_between_calls(monkeypatch) -> None:
    stop, calls = threading.Event(), []

    def kernel(base, first, lengths, page, advice_):
        calls.append(first.tolist())
        if len(calls) == 2:
            stop.set()
        return -1

    monkeypatch.setattr(advice, "_LINKED", [True])  # the real kernel is never called
    monkeypatch.setattr(advice, "_advise", kernel)
    assert advice.advise(4096, np.arange(0, 20, 2), advice.WILLNEED, stop, chunk=3)
    assert calls == [[0, 2, 4], [6, 8, 10]]


def test_a_platform_without_madvise_advises_nothing(monkeypatch) -> None:
    def unlinkable(*args):
        raise RuntimeError("no symbol madvise")

    monkeypatch.setattr(advice, "_LINKED", [])
    monkeypatch.setattr(advice, "_advise", unlinkable)
    advice.warm()  # a follower still starts
    assert not advice.advise(4096, np.array([1, 2]), advice.WILLNEED)
