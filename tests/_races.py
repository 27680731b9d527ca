"""Helpers for the tests that race a batch-changing call (select, adopt) against readers of a
cache or a state from other threads."""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Iterator, List

import pytest


@pytest.fixture
def fast_thread_switches() -> Iterator[None]:
    """Switch threads every few microseconds (not every 5 ms) so races show up in a few hundred
    iterations."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def race_readers(check: Callable[[], List[Any]], writer: Callable[[], None], readers: int = 2) -> List[Any]:
    """Run ``check`` over and over in ``readers`` threads while ``writer`` runs in this one, then
    once more after it; returns what the checks reported plus any exception they raised."""
    problems: List[Any] = []
    done = threading.Event()

    def read() -> None:
        try:
            while True:
                last = done.is_set()
                problems.extend(check())
                if last:
                    return
        except Exception as e:  # noqa: BLE001 - any error is a failure of the test
            problems.append(e)

    threads = [threading.Thread(target=read) for _ in range(readers)]
    for t in threads:
        t.start()
    writer()
    done.set()
    for t in threads:
        t.join(timeout=30)
    return problems


def race_pair(first: Callable[[], Any], second: Callable[[], Any]) -> None:
    """Start ``first`` and ``second`` in two threads at the same moment; a ValueError or
    IndexError (the call that runs second no longer fits) is expected and swallowed."""
    start = threading.Barrier(2)

    def call(fn: Callable[[], Any]) -> None:
        start.wait()
        try:
            fn()
        except (ValueError, IndexError):
            pass

    ts = [threading.Thread(target=call, args=(fn,)) for fn in (first, second)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
