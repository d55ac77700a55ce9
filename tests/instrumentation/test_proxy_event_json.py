"""Upstream events are parsed through orjson when that reads them exactly as ``json`` does
(issue 21: one parse per event is a per-token cost at 1,000 tokens/s), and an event the proxy
re-serializes never has a number changed."""

from __future__ import annotations

import json

import pytest

from flowtrial.instrumentation.proxy.protocols.base import SSEParser, loads
from flowtrial.instrumentation.proxy.protocols.chat import ChatAdapter
from flowtrial.instrumentation.proxy.protocols.messages import MessagesAdapter

BEYOND_64_BITS = ['{"x":123456789012345678901234567890}', '{"big":-9223372036854775809}',
                  '{"u":18446744073709551616}']
TRICKY = [
    '{"a":1,"a":2}', '{"x":NaN}', '{"x":-Infinity}', '{"f":1e400}', '{"f":1.5e-320}',
    '{"u":18446744073709551615}', '{"i":-9223372036854775808}', '{"f":0.30000000000000004441}',
    '{"s":"\\ud800"}', '{"s":"\\u00e9 \\u0000 \\ud83d\\ude00"}', ' [1, 2.50, -0.0] ',
    '{"a":1}x', "", "{", '{"a":01}', '"\\x"',
]


@pytest.mark.parametrize("text", TRICKY)
def test_loads_reads_every_text_as_json_does(text: str) -> None:
    def read(f):  # type: ignore[no-untyped-def]
        try:
            return repr(f(text))
        except ValueError as exc:
            return type(exc).__name__
    assert read(loads) == read(json.loads)


@pytest.mark.parametrize("text", BEYOND_64_BITS)
def test_loads_reads_an_integer_beyond_64_bits_as_the_nearest_float(text: str) -> None:
    # The one documented difference; exact_obj keeps such events exact when re-serialized.
    (got,) = loads(text).values()
    (want,) = json.loads(text).values()
    assert got == float(want)


def _events(raw: bytes):  # type: ignore[no-untyped-def]
    return SSEParser().feed(raw)


def test_a_re_serialized_chat_event_keeps_a_number_beyond_64_bits() -> None:
    # "content" twice (inside another field too): the field template cannot be used, so the
    # pieces are re-serialized from the parsed event.
    chunk = {"id": "c1", "x_trace": 123456789012345678901234567890, "x_note": {"content": "hi"},
             "choices": [{"index": 0, "delta": {"content": "hi"}}]}
    raw = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    (ev,) = _events(raw)
    adapter = ChatAdapter()
    c = adapter.classify(ev)
    out = [json.loads(b.split(b"data: ", 1)[1]) for b in adapter.split(ev, c, ["h", "i"])]
    assert [o["choices"][0]["delta"]["content"] for o in out] == ["h", "i"]
    assert all(o["x_trace"] == 123456789012345678901234567890 for o in out)
    assert c.obj["choices"][0]["delta"]["content"] == "hi"  # the parsed event is untouched


def test_a_re_serialized_messages_event_keeps_a_number_beyond_64_bits() -> None:
    body = {"type": "content_block_delta", "index": 0, "x_n": -99999999999999999999,
            "delta": {"type": "text_delta", "text": "ab"}, "x": {"text": "ab"}}
    raw = b"event: content_block_delta\ndata: " + json.dumps(body).encode() + b"\n\n"
    (ev,) = _events(raw)
    adapter = MessagesAdapter()
    c = adapter.classify(ev)
    out = [json.loads(b.split(b"data: ", 1)[1]) for b in adapter.split(ev, c, ["a", "b"])]
    assert [o["delta"]["text"] for o in out] == ["a", "b"]
    assert all(o["x_n"] == -99999999999999999999 for o in out)
