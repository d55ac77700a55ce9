"""Per-prompt request indices, claimed in blocks so no two processes ever draw the same one.

A per-prompt draw is seeded by the participant's request index. Each participant's
``draw_counters`` row holds their next unclaimed index; a process claims :data:`INDEX_BLOCK`
indices at a time by advancing it in one transaction, so proxy restarts, the workers of one
proxy and separate proxies on one database (a load balancer without sticky sessions) never
repeat a draw. Indices a process claimed but did not use are skipped.

A claim is a write: under load it can wait for the database's write lock (SQLite's busy
handler backs off for up to a second or more). So none happens on a request's path in the
steady state: at startup a process claims a block for every enrolled participant in one
transaction, and when half a block is used the next one is claimed in the background. Only a
participant enrolled after startup waits for their first claim.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import Engine, bindparam, text

__all__ = ["INDEX_BLOCK", "DrawIndices"]

log = logging.getLogger(__name__)

#: Request indices a process claims at a time.
INDEX_BLOCK = 16

_PARTICIPANTS = text("SELECT id FROM participants ORDER BY id")
_COUNTER_ROW = text("INSERT INTO draw_counters (participant_id, next_index) VALUES (:pid, 0) "
                    "ON CONFLICT (participant_id) DO NOTHING")
# The UPDATE takes the row's write lock (PostgreSQL) / the database's (SQLite) until commit,
# so concurrent claims serialize and each reads back the end of its own block.
_CLAIM = text("UPDATE draw_counters SET next_index = next_index + :n WHERE participant_id = :pid")
_ENDS = text("SELECT participant_id, next_index FROM draw_counters WHERE participant_id IN "
             ":pids").bindparams(bindparam("pids", expanding=True))


class DrawIndices:
    """Hands out each participant's request indices from blocks this process claimed."""

    def __init__(self, engine: Engine, block: int = INDEX_BLOCK) -> None:
        self.engine = engine
        self.block = block
        self.claims = 0  # claim transactions run
        self._current: dict[str, tuple[int, int]] = {}  # pid -> (next, end)
        self._spare: dict[str, asyncio.Future[int]] = {}  # pid -> start of the next block
        self._locks: dict[str, asyncio.Lock] = {}

    def claim(self, pids: list[str]) -> dict[str, int]:
        """Claim one block for each of ``pids`` in one transaction; the first index of each."""
        # One order for every process: claims of overlapping participants lock the same rows
        # in the same order, so two proxies starting at once cannot deadlock (PostgreSQL).
        pids = sorted(set(pids))
        if not pids:
            return {}
        with self.engine.begin() as conn:
            conn.execute(_COUNTER_ROW, [{"pid": p} for p in pids])
            conn.execute(_CLAIM, [{"pid": p, "n": self.block} for p in pids])
            ends = {p: int(e) for p, e in conn.execute(_ENDS, {"pids": pids})}
        self.claims += 1
        return {p: ends[p] - self.block for p in pids}

    async def start(self) -> None:
        """Claim a first block for every enrolled participant (one transaction). A failure
        (the database is down) is logged: blocks are then claimed on first use."""
        try:
            starts = await asyncio.to_thread(self._claim_enrolled)
        except Exception as exc:  # noqa: BLE001 - the proxy serves on; claims retry later
            log.warning("could not claim per-prompt draw indices at startup (%s): claiming "
                        "them on each participant's first request", exc)
            return
        for pid, first in starts.items():
            self._current.setdefault(pid, (first, first + self.block))

    def _claim_enrolled(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            pids = [p for (p,) in conn.execute(_PARTICIPANTS)]
        return self.claim(pids)

    async def next(self, pid: str) -> int:
        """The participant's next request index."""
        nxt, end = self._current.get(pid, (0, 0))
        if nxt >= end:
            async with self._locks.setdefault(pid, asyncio.Lock()):
                nxt, end = self._current.get(pid, (0, 0))
                if nxt >= end:
                    spare = self._spare.pop(pid, None)
                    nxt = await (spare if spare is not None else self._claim_later(pid))
                    end = nxt + self.block
        self._current[pid] = (nxt + 1, end)
        if end - nxt - 1 <= self.block // 2 and pid not in self._spare:
            self._spare[pid] = self._claim_later(pid)  # ready before this block runs out
        return nxt

    def _claim_later(self, pid: str) -> asyncio.Future[int]:
        fut = asyncio.ensure_future(asyncio.to_thread(lambda: self.claim([pid])[pid]))
        # A failed spare claim surfaces when its block is needed (it is popped then, so the
        # next request claims afresh); retrieving the exception here keeps asyncio from
        # logging it as never retrieved.
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        return fut
