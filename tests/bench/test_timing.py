"""The benchmarks' shared helpers: ``--threads`` sets torch's threads only when given, ``seconds`` calls the function once."""

from __future__ import annotations

import sys

import torch

from bench import timing


def test_threads_are_set_only_when_asked(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(sys, "argv", ["bench", "--threads", "1"])
        assert timing.parsed(timing.parser("doc")).threads == 1
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        monkeypatch.setattr(sys, "argv", ["bench"])
        assert timing.parsed(timing.parser("doc")).threads is None
        assert torch.get_num_threads() == 2  # left as it was
        assert timing.parsed(timing.parser("doc", threads=1)).threads == 1
    finally:
        torch.set_num_threads(before)


def test_seconds_calls_the_function_once():
    calls = []
    elapsed = timing.seconds(lambda: calls.append(1))
    assert calls == [1] and isinstance(elapsed, float) and elapsed >= 0
