"""Counts behind the caps that must hold across ``flowtrial proxy --workers N`` processes.

A cap counted per process would let N workers admit N times the cap (the kernel hands each
connection to any worker). The supervisor maps one anonymous shared memory region before it
forks the workers; each worker owns one part of it, a small open-addressing table of
(key hash, count) that only that worker writes, so no lock is needed and a worker that dies
leaves nothing behind (its replacement clears its part). A check sums the key's count over
every worker's part: a few microseconds, and only when a WebSocket opens or closes, a
connection opens or sends its head, or an upload is admitted — never on the token path.

The tables (:data:`TABLES`, each from :func:`counts`):

- ``websockets``: open Responses WebSockets per participant (add, then check: never over);
- ``ingest``: uploads of one participant being ingested (add, then check: never over);
- ``quota``: bytes stored per participant and UTC day (add, then check: never over);
- ``preauth``: connections without a whole request head, per client address and in total.
  Addresses are unbounded, so this one is a :class:`SharedSketch` of fixed size (count-min:
  a collision can only count high, and needs both of two hashes to collide).

Without ``--workers`` (one process) :func:`counts` gives each caller a table of one part.
"""

from __future__ import annotations

import hashlib
import mmap

__all__ = ["SLOTS", "TABLES", "SharedCounts", "SharedSketch", "Table", "attach", "counts",
           "share_across"]

#: Keys one worker can hold at once (participants with an open WebSocket through it); a
#: full part counts a new key in the process only (logged by the caller's cap, never wrong low
#: for keys already held).
SLOTS = 8192
_CELL = 8  # bytes per uint64


def _key_hash(key: str) -> int:
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return h or 1  # 0 marks an empty slot


class _WorkerParts:
    """``workers`` equal parts of uint64 cells in shared memory (MAP_SHARED: a forked worker
    sees the same cells); each worker writes only its own part, every worker reads all."""

    def __init__(self, workers: int, part: int) -> None:
        self.workers = workers
        self.part = part  # cells per worker
        self._mem = mmap.mmap(-1, workers * part * _CELL)
        self._cells = memoryview(self._mem).cast("Q")
        self.me = 0

    def attach(self, worker: int) -> None:
        """This process is worker ``worker``: its part starts empty (a restart's too)."""
        self.me = worker
        self.clear_mine()

    def clear_mine(self) -> None:
        """Empty this worker's part (e.g. the quota's at a new UTC day)."""
        start = self.me * self.part
        self._cells[start:start + self.part] = memoryview(bytes(self.part * _CELL)).cast("Q")


class SharedCounts(_WorkerParts):
    """``workers`` parts of :data:`SLOTS` (hash, count) pairs in shared memory."""

    def __init__(self, workers: int = 1, slots: int = SLOTS) -> None:
        super().__init__(workers, slots * 2)
        self.slots = slots

    def _find(self, worker: int, h: int, insert: bool) -> int | None:
        """The index of ``h``'s count cell in ``worker``'s part (linear probing)."""
        base, cells = worker * self.part, self._cells
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


class SharedSketch(_WorkerParts):
    """Counts by any key in a fixed ``2 × width`` cells per worker (count-min): a key adds
    to one cell of each row; its count is the smaller of its two cells summed over workers.
    Never low; high only when another key shares both its cells."""

    ROWS = 2

    def __init__(self, workers: int = 1, width: int = 4096) -> None:
        super().__init__(workers, self.ROWS * width)
        self.width = width

    def _offsets(self, key: str) -> tuple[int, int]:
        h = hashlib.blake2b(key.encode(), digest_size=8).digest()
        return (int.from_bytes(h[:4], "little") % self.width,
                self.width + int.from_bytes(h[4:], "little") % self.width)

    def total(self, key: str) -> int:
        """``key``'s count summed over every worker (never below the true count)."""
        part, cells = self.part, self._cells
        return min(sum(cells[w * part + o] for w in range(self.workers))
                   for o in self._offsets(key))

    def add(self, key: str, delta: int) -> bool:
        """Add ``delta`` to this worker's cells of ``key`` (never below 0)."""
        base = self.me * self.part
        for o in self._offsets(key):
            self._cells[base + o] = max(0, self._cells[base + o] + delta)
        return True


Table = SharedCounts | SharedSketch
#: The shared tables and what makes each (module docstring).
TABLES: dict[str, type[SharedCounts] | type[SharedSketch]] = {
    "websockets": SharedCounts, "ingest": SharedCounts, "quota": SharedCounts,
    "preauth": SharedSketch}
_shared: dict[str, Table] | None = None


def share_across(workers: int) -> dict[str, Table]:
    """In the supervisor, before forking: the tables every worker will see."""
    global _shared
    _shared = {name: make(workers) for name, make in TABLES.items()}
    return _shared


def attach(worker: int) -> None:
    """In a forked worker: claim its part of each of the supervisor's tables."""
    for table in (_shared or {}).values():
        table.attach(worker)


def counts(name: str = "websockets") -> Table:
    """Table ``name`` (:data:`TABLES`): the workers' shared one, or (one process) a new
    one of its own."""
    if _shared is not None:
        return _shared[name]
    return TABLES[name](1)
