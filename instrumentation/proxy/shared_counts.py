"""Per-participant counts that hold across ``flowtrial proxy --workers N`` processes.

A cap counted per process would let N workers admit N times the cap (the kernel hands each
connection to any worker). The supervisor maps one anonymous shared memory region before it
forks the workers; each worker owns one part of it, a small open-addressing table of
(key hash, count) that only that worker writes, so no lock is needed and a worker that dies
leaves nothing behind (its replacement clears its part). A check sums the key's count over
every worker's part: a few microseconds, and only when a WebSocket opens or closes — never on
the token path. Two workers admitting at the very same instant may each see the other's count
before its increment, so a cap can be passed by at most ``workers - 1``.

Without ``--workers`` (one process) :func:`counts` gives each app a table of one part.
"""

from __future__ import annotations

import hashlib
import mmap

__all__ = ["SLOTS", "SharedCounts", "attach", "counts", "share_across"]

#: Keys one worker can hold at once (participants with an open WebSocket through it); a
#: full part counts a new key in the process only (logged by the caller's cap, never wrong low
#: for keys already held).
SLOTS = 8192
_CELL = 8  # bytes per uint64


def _key_hash(key: str) -> int:
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return h or 1  # 0 marks an empty slot


class SharedCounts:
    """``workers`` parts of :data:`SLOTS` (hash, count) pairs in shared memory."""

    def __init__(self, workers: int = 1, slots: int = SLOTS) -> None:
        self.workers = workers
        self.slots = slots
        self._mem = mmap.mmap(-1, workers * slots * 2 * _CELL)  # MAP_SHARED: fork sees one
        self._cells = memoryview(self._mem).cast("Q")
        self.me = 0

    def attach(self, worker: int) -> None:
        """This process is worker ``worker``: its part starts empty (a restart's too)."""
        self.me = worker
        start = worker * self.slots * 2
        self._cells[start:start + self.slots * 2] = memoryview(
            bytes(self.slots * 2 * _CELL)).cast("Q")

    def _find(self, worker: int, h: int, insert: bool) -> int | None:
        """The index of ``h``'s count cell in ``worker``'s part (linear probing)."""
        base, cells = worker * self.slots * 2, self._cells
        for probe in range(self.slots):
            i = base + ((h + probe) % self.slots) * 2
            held = cells[i]
            if held == h:
                return i + 1
            if held == 0:
                if not insert:
                    return None
                cells[i + 1] = 0
                cells[i] = h
                return i + 1
        return None

    def total(self, key: str) -> int:
        """``key``'s count summed over every worker."""
        h, cells = _key_hash(key), self._cells
        return sum(cells[i] for w in range(self.workers)
                   if (i := self._find(w, h, insert=False)) is not None)

    def add(self, key: str, delta: int) -> bool:
        """Add ``delta`` to this worker's count of ``key`` (never below 0); False when this
        worker's part is full."""
        i = self._find(self.me, _key_hash(key), insert=delta > 0)
        if i is None:
            return delta <= 0
        self._cells[i] = max(0, self._cells[i] + delta)
        return True


_shared: SharedCounts | None = None


def share_across(workers: int) -> SharedCounts:
    """In the supervisor, before forking: the table every worker will see."""
    global _shared
    _shared = SharedCounts(workers)
    return _shared


def attach(worker: int) -> None:
    """In a forked worker: claim its part of the supervisor's table."""
    if _shared is not None:
        _shared.attach(worker)


def counts() -> SharedCounts:
    """The table for a proxy app: the workers' shared one, or (one process) its own."""
    return _shared if _shared is not None else SharedCounts(1)
