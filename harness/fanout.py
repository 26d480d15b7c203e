"""Asking many devices the same question at once: a bounded pool of threads, the answers in the order asked.
A probe of every host one after another costs the sum of their round trips; this costs about the slowest."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")
WORKERS = 16  # threads at most, whatever the number of hosts (each mostly waits on its SSH channel)


def fan_out(fn: Callable[[T], R], items: Iterable[T], *, workers: int = WORKERS, name: str = "probe") -> list[R]:
    """`[fn(item) for item in items]`, at most `workers` calls at a time. Results come in the order of `items`;
    an exception is raised (the first in that order) only once every call has ended."""
    items = list(items)
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix=name) as pool:
        futures = [pool.submit(fn, item) for item in items]
    return [future.result() for future in futures]
