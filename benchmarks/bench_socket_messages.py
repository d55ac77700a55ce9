"""A large Responses WebSocket message and the proxy's event loop: how long a timer on the
loop is held up (a 2 ms ticker's longest and 99th-percentile lateness) while the proxy

- reads a 7 MB message (200k short items) on the loop, or through the body parser's process
  (``BodyParser.read_socket_message``, what the proxy does above ``OFF_LOOP_BYTES``);
- sends a 7 MB message of text to a real upstream over WebSocket with permessage-deflate
  (the simulated model in its own process), whole, or as ``FRAGMENT_CHARS`` fragments with
  the loop given way between them (what the proxy does).

Each variant runs ``--rounds`` times, alternating, in one run, beside the machine's floor
(lateness of a bare ``asyncio.sleep`` in a fresh process). Loopback only.

    python benchmarks/bench_socket_messages.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_proxy_common import mock_model_process, percentile, timer_noise  # noqa: E402

from tests.instrumentation.loop_stalls import stalls_during  # noqa: E402


def dense_message() -> str:
    return json.dumps({"type": "response.cancel",
                       "input": [{"role": "user", "content": "hi"}] * 200_000})


def text_message(rng: random.Random) -> str:
    """A 7 MB warm-up of code-like text (compresses about 2:1, as source does)."""
    alphabet = "abcdefghijklmnop qrstuvwxyz_(){}:=.,\n    "
    items = [{"role": "user", "content": "".join(rng.choices(alphabet, k=450))}
             for _ in range(15_000)]
    return json.dumps({"type": "response.create", "model": "m", "generate": False,
                       "input": items})


async def stall_figures(work: Callable[[], Awaitable[object]]) -> tuple[float, float, float]:
    """(longest, p99 lateness of a 2 ms ticker, wall time of ``work``), in ms."""
    stalls = await stalls_during(work)
    return (stalls.longest * 1e3, percentile([x * 1e3 for x in stalls.late], 99),
            stalls.took * 1e3)


async def run(upstream_url: str, rounds: int) -> dict[str, list[tuple[float, float, float]]]:
    from flowtrial.instrumentation.proxy import upstream as up
    from flowtrial.instrumentation.proxy.body_parser import BodyParser
    from flowtrial.instrumentation.proxy.socket_messages import read_socket_message

    dense, text = dense_message(), text_message(random.Random(1))
    parser = BodyParser()
    await parser.read_socket_message(json.dumps({"type": "x", "pad": "y" * 300_000}), 10**8)
    sock = up._HttpSocket("ws" + upstream_url[4:] + "/responses", {}, up.httpx.Timeout(60))
    fragment = up.FRAGMENT_CHARS

    async def send_text() -> None:
        async for _ in sock.turn(text, {}):
            pass

    async def read_on_loop() -> None:
        read_socket_message(dense, 10**8)

    async def read_off_loop() -> None:
        await parser.read_socket_message(dense, 10**8)

    async def send_whole() -> None:
        up.FRAGMENT_CHARS = 10**9  # one frame, compressed in one go
        try:
            await send_text()
        finally:
            up.FRAGMENT_CHARS = fragment

    await send_text()  # connected (deflate negotiated) before timing
    out: dict[str, list[tuple[float, float, float]]] = {}
    variants = {"read on the loop": read_on_loop, "read off the loop": read_off_loop,
                "send whole": send_whole, "send as fragments": send_text}
    try:
        for _ in range(rounds):
            for name, work in variants.items():
                out.setdefault(name, []).append(await stall_figures(work))
    finally:
        await sock.close()
        await asyncio.to_thread(parser.close)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if not 1 <= args.rounds <= 50:
        ap.error("--rounds: between 1 and 50")
    print(f"machine floor (asyncio.sleep lateness, ms): {timer_noise(2.0)}")
    with mock_model_process() as url:
        out = asyncio.run(run(url, args.rounds))
    print(f"{'variant':<20}{'longest stall ms (median, max)':>32}{'p99 ms':>9}{'wall ms':>9}")
    for name, rows in out.items():
        longest = sorted(r[0] for r in rows)
        print(f"{name:<20}{longest[len(longest) // 2]:>20.1f}{longest[-1]:>12.1f}"
              f"{sorted(r[1] for r in rows)[len(rows) // 2]:>9.1f}"
              f"{sorted(r[2] for r in rows)[len(rows) // 2]:>9.0f}")


if __name__ == "__main__":
    main()
