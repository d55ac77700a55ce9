"""Precise releases: announced while they are waited for; other waits give way to them."""

from __future__ import annotations

import asyncio
import time

import pytest

from flowtrial.instrumentation.proxy.releases import (
    GIVE_WAY_NS,
    STALE_NS,
    give_way,
    precise_release,
    soonest_release,
)
from flowtrial.instrumentation.proxy.shaping import RELEASE_SPIN_NS, sleep_until

# Millisecond timing: reruns on a busy machine, the reason logged (tests/conftest.py).
pytestmark = pytest.mark.timing
_now = time.monotonic_ns


def test_releases_are_announced_for_their_wait_only() -> None:
    assert soonest_release() is None
    with precise_release(5_000), precise_release(3_000):
        assert soonest_release() == 3_000
    assert soonest_release() is None

    async def main() -> list[int | None]:
        seen: list[int | None] = []
        due = time.monotonic_ns() + 20_000_000
        waiter = asyncio.ensure_future(sleep_until(due, 1_500_000))
        await asyncio.sleep(0.005)
        seen.append(soonest_release())
        await waiter
        seen.append(soonest_release())
        plain = asyncio.ensure_future(sleep_until(time.monotonic_ns() + 10_000_000))
        await asyncio.sleep(0.002)
        seen.append(soonest_release())  # later tokens' waits are not announced
        await plain
        return seen

    first, after, plain = asyncio.run(main())
    assert first is not None and after is None and plain is None


def test_give_way_returns_at_once_when_no_release_is_near() -> None:
    async def main() -> list[str]:
        order: list[str] = []
        asyncio.get_running_loop().call_soon(order.append, "other")
        await give_way()  # nothing announced: no turn of the loop
        order.append("nothing due")
        with precise_release(_now() + 50_000_000):  # due in 50 ms: far outside the margin
            await give_way()
        order.append("far release")
        await asyncio.sleep(0)
        return order

    assert asyncio.run(main()) == ["nothing due", "far release", "other"]


def test_give_way_waits_while_a_release_is_due_within_the_margin() -> None:
    async def main() -> tuple[int, int]:
        # Overdue by ~0.25 ms when checked; a machine stall of STALE_NS would make it stale.
        due = _now() + GIVE_WAY_NS // 2
        turns = 0

        async def count_turns() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        counter = asyncio.ensure_future(count_turns())
        await asyncio.sleep(0)
        with precise_release(due):
            waiter = asyncio.ensure_future(give_way())
            await asyncio.sleep(0.00075)  # the release is overdue now
            assert not waiter.done(), "gave no way to an announced, overdue release"
        before = turns
        await waiter  # the announcement is withdrawn: it returns on its next turn
        counter.cancel()
        return before, turns - before

    for attempt in range(3):  # a stall of the machine (over STALE_NS) can spoil one attempt
        try:
            before, after = asyncio.run(main())
            break
        except AssertionError:
            if attempt == 2:
                raise
    assert before > 10 and after <= 2


def test_a_paced_token_due_with_a_first_token_goes_out_after_it() -> None:
    """Two streams' releases fall due together: the paced token of one (due 0.2 ms earlier)
    waits for the first token of the other, and is late by a fraction of a millisecond only;
    a token due well before the first token is not held."""

    async def main() -> dict[str, int]:
        out: dict[str, int] = {}
        first_due = _now() + 30_000_000

        async def release(name: str, due: int, spin: int) -> None:
            await sleep_until(due, spin)
            out[name] = _now()

        await asyncio.gather(
            release("first token", first_due, RELEASE_SPIN_NS),
            release("paced token, due just before", first_due - 200_000, 0),
            release("paced token, due well before", first_due - 5_000_000, 0),
        )
        out["first_due"] = first_due
        return out

    def held(t: dict[str, int]) -> bool:
        return (t["first token"] <= t["paced token, due just before"]
                and t["paced token, due well before"] < t["first_due"])

    for _ in range(3):  # a stall of the machine can spoil one attempt; the rule cannot
        t = asyncio.run(main())
        if held(t):
            break
    assert t["first token"] <= t["paced token, due just before"]
    assert t["paced token, due well before"] < t["first_due"]
    assert t["first token"] >= t["first_due"]  # never early
    assert t["paced token, due just before"] - t["first token"] < 20_000_000


def test_a_stale_announcement_is_not_waited_for() -> None:
    """An announcement left behind (its loop stopped) holds nothing up for long."""

    async def main() -> float:
        with precise_release(_now() - STALE_NS - 1_000_000):
            t0 = time.monotonic()
            await asyncio.wait_for(give_way(), 1.0)
            return time.monotonic() - t0

    assert asyncio.run(main()) < 0.5
