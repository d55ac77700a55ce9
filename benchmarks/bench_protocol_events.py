"""The proxy's per-event work on an upstream stream, per protocol, with and without orjson.

A fast upstream sends one SSE event per token or two: each is cut out of the byte stream
(``SSEParser``), parsed and classified by the protocol adapter, and either restamped or
split. This measures that work in µs per event on the simulated model's own streams (an
answer of ``--tokens`` tokens, ``--per-event`` tokens per event), with event JSON parsed
through orjson (``protocols.base.loads``) and through the standard ``json``, alternated in
one run so the ratio is fair on a busy machine.

    python benchmarks/bench_protocol_events.py [--tokens 2000] [--per-event 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flowtrial.instrumentation.mock_model import MockModel  # noqa: E402
from flowtrial.instrumentation.mock_model.generation import Schedule  # noqa: E402
from flowtrial.instrumentation.proxy.protocols import base  # noqa: E402
from flowtrial.instrumentation.proxy.protocols.base import SSEParser  # noqa: E402
from flowtrial.instrumentation.proxy.protocols.chat import ChatAdapter  # noqa: E402
from flowtrial.instrumentation.proxy.protocols.messages import MessagesAdapter  # noqa: E402
from flowtrial.instrumentation.proxy.protocols.responses import ResponsesAdapter  # noqa: E402

PROTOCOLS = {
    "chat": ("/v1/chat/completions", ChatAdapter,
             {"messages": [{"role": "user", "content": "explain python generators"}]}),
    "messages": ("/v1/messages", MessagesAdapter,
                 {"max_tokens": 8000,
                  "messages": [{"role": "user", "content": "explain python generators"}]}),
    "responses": ("/v1/responses", ResponsesAdapter, {"input": "explain python generators"}),
}


def stream(path: str, body: dict, tokens: int, per_event: int) -> bytes:
    """The simulated model's stream for ``body``, ``per_event`` tokens per event."""
    model = MockModel(tokens_per_second=1e9, ttft_ms=0, answer_tokens=(tokens, tokens))

    async def paced(self: Schedule, pieces: tuple[str, ...]):  # type: ignore[no-untyped-def]
        for i in range(0, len(pieces), per_event):
            yield "".join(pieces[i:i + per_event])

    Schedule.paced = paced  # type: ignore[method-assign]
    raw = json.dumps({"model": "flowtrial-sim-1", "stream": True, **body}).encode()
    reply = asyncio.run(model.respond("POST", path, {}, raw))
    return asyncio.run(reply.read())


def per_event_us(raw: bytes, adapter_cls: type, repeat: int) -> tuple[float, int]:
    """Best µs per event of parse + classify + restamp over ``repeat`` passes."""
    best, n = float("inf"), 0
    for _ in range(repeat):
        adapter = adapter_cls()
        t0 = time.perf_counter()
        evs = SSEParser().feed(raw)
        for ev in evs:
            adapter.restamp(ev, adapter.classify(ev))
        best = min(best, time.perf_counter() - t0)
        n = len(evs)
    return best / n * 1e6, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--per-event", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    fast = base._orjson
    print(f"{'protocol':>10} {'events':>6} {'json µs/ev':>10} {'orjson µs/ev':>12} {'ratio':>6}")
    for name, (path, cls, body) in PROTOCOLS.items():
        raw = stream(path, body, args.tokens, args.per_event)
        got: dict[str, list[float]] = {"json": [], "orjson": []}
        n = 0
        for _ in range(3):  # alternate, so the machine's load falls on both alike
            for which, mod in (("json", None), ("orjson", fast)):
                base._orjson = mod
                us, n = per_event_us(raw, cls, args.repeat)
                got[which].append(us)
        base._orjson = fast
        j, o = min(got["json"]), min(got["orjson"])
        print(f"{name:>10} {n:>6} {j:>10.2f} {o:>12.2f} {j / o:>6.2f}")


if __name__ == "__main__":
    main()
