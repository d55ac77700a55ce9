"""The proxy's precise releases, and giving way to them.

A precise release is a moment the study measures: a first output token leaving at
t_request + ttft, a held answer leaving whole. The shaper announces each one while it waits
for it (:func:`precise_release`); two parts of the proxy plan around the announcements:

- the quiet garbage collector (:mod:`~flowtrial.instrumentation.proxy.quiet_gc`) runs the older
  generations only when no release is due within a collection's length;
- other work that can wait a fraction of a millisecond **gives way** (:func:`give_way`): a
  paced later token that falls due, the next slice of a prefetched upstream chunk, a new
  request's handling. Without that, a first token due at the same moment as a batch of
  paced tokens of other streams (streams started a pace's multiple apart release together)
  queues behind all of them: 2-3 ms at 100 streams, each token costing ~0.1 ms of the loop
  (seen with ``perf sched`` in benchmarks/bench_proxy_shaping_protocols.py). A later token
  given way to is a fraction of a millisecond late, once; the pace runs on absolute
  deadlines, so nothing accumulates.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterator

__all__ = ["GIVE_WAY_NS", "STALE_NS", "give_way", "precise_release", "soonest_release"]

_monotonic_ns = time.monotonic_ns
# Deadlines (monotonic ns) of the releases now being waited for, by ticket. Written from the
# event loop of each proxy app in the process, read by the collectors' tasks and by
# give_way; plain dict operations and min() over int values run under the GIL without
# yielding it.
_RELEASES: dict[int, int] = {}
_tickets = itertools.count()

#: Work that can wait yields while a precise release is due within this margin (or overdue):
#: a few times what one paced token costs the loop, well inside the shaper's spin window.
GIVE_WAY_NS = 500_000
#: An announced release this long overdue is not given way to any more.
STALE_NS = 5_000_000


@contextlib.contextmanager
def precise_release(deadline_ns: int) -> Iterator[None]:
    """Announce a timed release due at ``deadline_ns`` for as long as the block runs."""
    ticket = next(_tickets)
    _RELEASES[ticket] = deadline_ns
    try:
        yield
    finally:
        del _RELEASES[ticket]


def soonest_release() -> int | None:
    """The earliest announced release deadline (monotonic ns), or None."""
    return min(_RELEASES.values(), default=None)


async def give_way(margin_ns: int = GIVE_WAY_NS) -> None:
    """Yield to the event loop for as long as a precise release is due within ``margin_ns``
    (or overdue), so it goes out first; return at once otherwise.

    It cannot wait long: an announced release's task is spinning on the loop within its
    last ``RELEASE_SPIN_NS`` and withdraws the announcement on the turn its deadline passes.
    An announcement :data:`STALE_NS` overdue is not waited for (its loop, another proxy's
    in the same process, may have stopped with it).
    """
    while (soonest := soonest_release()) is not None:
        ahead = soonest - _monotonic_ns()
        if ahead > margin_ns or ahead < -STALE_NS:
            return
        await asyncio.sleep(0)
