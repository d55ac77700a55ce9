"""Where a stream's events come from: a whole answer in one read is handed out in slices."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from flowtrial.instrumentation.proxy.protocols.base import SSEEvent, SSEParser
from flowtrial.instrumentation.proxy.protocols.chat import ChatAdapter
from flowtrial.instrumentation.proxy.protocols.responses import (
    ResponsesAdapter,
    ResponsesSocketAdapter,
)
from flowtrial.instrumentation.proxy.recorder import CycleRecord
from flowtrial.instrumentation.proxy.sources import Direct, Prefetch
from flowtrial.instrumentation.tokens import split_tokens


def _record() -> CycleRecord:
    return CycleRecord(id="c1", participant_id="p1", protocol="chat", stream=True, model="m",
                       upstream="u", mono_anchor_ns=0, wall_anchor_ns=0, t_request_ns=0,
                       started_at=datetime.now(UTC))


def _answer(n: int) -> bytes:
    chunks = [{"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
               "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}
              for i in range(n)]
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + \
        b"data: [DONE]\n\n"


async def _body(*chunks: bytes) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


def test_prefetch_hands_a_whole_answer_out_in_slices_and_lets_others_run() -> None:
    async def main() -> tuple[list[str], list[int], int, list[bool]]:
        ticks = 0
        stop = False

        async def other() -> None:  # another stream's due tokens
            nonlocal ticks
            while not stop:
                ticks += 1
                await asyncio.sleep(0)

        rec = _record()
        # Cut mid-event, so an event straddles two reads.
        whole = _answer(200)
        src = Prefetch(_body(whole[:5000], whole[5000:]), ChatAdapter(), rec, SSEParser())
        t = asyncio.create_task(other())
        texts, sizes, readiness = [], [], []
        while (got := await src.get()) is not None:
            _, evs = got
            sizes.append(len(evs))
            texts += [c.text for _, c in evs if c.text]
            readiness.append(src.ready())
        stop = True
        await t
        await src.close()
        return texts, sizes, ticks, readiness

    texts, sizes, ticks, readiness = asyncio.run(main())
    assert texts == [f"t{i} " for i in range(200)]  # all of them, in order
    assert max(sizes) <= 16 and sum(sizes) == 201  # 200 deltas + [DONE], in slices
    assert ticks >= len(sizes) - 2  # the other task ran between slices
    assert readiness[:-1] == [True] * (len(sizes) - 1)  # more of the chunk is at hand


def test_prefetch_is_not_ready_while_the_upstream_has_sent_nothing_more() -> None:
    """ready() False means get() would wait: the relay must flush what it holds first."""
    async def main() -> tuple[bool, bool, int]:
        more = asyncio.Event()

        async def body() -> AsyncIterator[bytes]:
            yield _answer(20).removesuffix(b"data: [DONE]\n\n")
            await more.wait()
            yield b"data: [DONE]\n\n"

        src = Prefetch(body(), ChatAdapter(), _record(), SSEParser())
        n = 0
        while n < 20:
            got = await src.get()
            assert got is not None
            n += len(got[1])
        await asyncio.sleep(0.01)
        waiting = src.ready()
        more.set()
        await asyncio.sleep(0.01)
        arrived = src.ready()
        last = await src.get()
        await src.close()
        return waiting, arrived, len(last[1]) if last else 0

    waiting, arrived, last = asyncio.run(main())
    assert (waiting, arrived, last) == (False, True, 1)


def test_direct_and_prefetch_agree_and_stamp_the_first_byte() -> None:
    async def events(kind: type[Direct]) -> tuple[list[str | None], int | None]:
        rec = _record()
        whole = _answer(40)
        src = kind(_body(*[whole[i:i + 333] for i in range(0, len(whole), 333)]), ChatAdapter(),
                   rec, SSEParser())
        out = []
        while (got := await src.get()) is not None:
            out += [e.data for e, _ in got[1]]
        await src.close()
        return out, rec.t_upstream_first_ns

    (a, ta), (b, tb) = asyncio.run(events(Direct)), asyncio.run(events(Prefetch))
    assert a == b and len(a) == 41 and a[-1] == "[DONE]"
    assert ta is not None and tb is not None


# ------------------------------------------------------------------ Responses splitting

def _responses_event(obj: dict, socket: bool) -> SSEEvent:
    data = json.dumps(obj, ensure_ascii=False)
    if socket:
        return SSEEvent(data.encode(), None, data)
    return SSEEvent(f"event: {obj['type']}\ndata: {data}\n\n".encode(), obj["type"], data)


@pytest.mark.parametrize("socket", [False, True])
@pytest.mark.parametrize("order", ["seq_first", "text_first", "nested_seq"])
def test_responses_split_renumbers_every_piece_exactly(socket: bool, order: str) -> None:
    """Split text deltas carry one piece each and consecutive sequence numbers, every other
    byte untouched (SSE and WebSocket frames; the number before or after the text); an event
    with a second sequence_number inside takes the re-serializing path, same result."""
    text = 'print("héllo") # "sequence_number": 3'
    base = {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
            "content_index": 0}
    if order == "nested_seq":
        base["obfuscation"] = {"sequence_number": 1}
    obj = ({**base, "sequence_number": 7, "delta": text} if order == "seq_first"
           else {**base, "delta": text, "sequence_number": 7})
    adapter = ResponsesSocketAdapter() if socket else ResponsesAdapter()
    adapter.offset = 2  # two earlier pieces were added by splitting
    ev = _responses_event(obj, socket)
    c = adapter.classify(ev)
    pieces = split_tokens(text)
    assert len(pieces) > 2
    out = list(adapter.split(ev, c, pieces))
    got = [json.loads(raw if socket else raw.split(b"data: ", 1)[1]) for raw in out]
    assert [g["delta"] for g in got] == pieces
    assert [g["sequence_number"] for g in got] == list(range(9, 9 + len(pieces)))
    assert all({k: v for k, v in g.items() if k not in ("delta", "sequence_number")}
               == base for g in got)
    assert adapter.next_seq == 9 + len(pieces) and adapter.offset == 2 + len(pieces) - 1
    if order != "nested_seq":  # the template path keeps the event's own bytes
        for raw, piece, n in zip(out, pieces, range(9, 99), strict=False):
            expect = ev.raw.replace(json.dumps(text, ensure_ascii=False).encode(),
                                    json.dumps(piece, ensure_ascii=False).encode())
            assert raw == expect.replace(b'"sequence_number": 7', f'"sequence_number": {n}'
                                         .encode())
