"""Bounded fuzzing of the proxy's front door over real sockets (~20 s; ``FLOWTRIAL_FUZZ_S``
changes it): random bytes, random request lines and headers (some oversized), bodies that
lie about their length, trickle or stop, JSON with lone surrogates, NaN and huge numbers,
``Expect: 100-continue`` — from four connections at a time, with a real participant key half
of the time. Then the two checks of every front-door test: another participant's stream is
within its shaping target, and every answer is recorded.

What must hold meanwhile: the proxy never answers 500; every cycle id a client received is a
row; a row no client received the headers of is one the client walked away from
(``abandoned``). The seed is logged so a failure can be replayed (``FLOWTRIAL_FUZZ_SEED``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
from pathlib import Path

import pytest

from flowtrial.instrumentation.continue_data import CONTINUE_PATH
from flowtrial.instrumentation.participant_page import PREFIX
from tests.security.frontdoor_helpers import (
    MODEL,
    health,
    proxy,
    read_response,
    status_of,
    still_serving,
    study,
)

pytestmark = pytest.mark.timing
log = logging.getLogger("tests.front_door")

PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
         "/v1/messages/count_tokens", "/v1/models", "/flowtrial/v1/events", CONTINUE_PATH,
         "/flowtrial/v1/health", f"{PREFIX}/login", f"{PREFIX}/logout", "/", "/nope")
METHODS = ("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "BREW", "")
NASTY_TEXT = ("x\\udfff", "\\ud800", "\\u0000", "é☃😀", "=HYPERLINK(1)", "a" * 5000, "")


def _json_body(rng: random.Random) -> bytes:
    """Protocol-shaped JSON with hostile values; sometimes NaN/Infinity/1e999 literals."""
    text = rng.choice(NASTY_TEXT)
    obj = {"model": rng.choice([MODEL, f"{MODEL}{text}", text]),
           "stream": rng.random() < 0.7, "max_tokens": rng.choice([1, 4, 16] * 3 + [-1, 10**9]),
           "messages": [{"role": rng.choice(["user"] * 6 + ["system", "tool", "bogus"]),
                         "content": f"write code {text}"}],
           "input": f"hi {text}", "events": [{"kind": "custom", "payload": {"t": text}}]}
    body = json.dumps(obj).replace("\\\\u", "\\u")  # let the escapes through as escapes
    for literal in ("NaN", "Infinity", "-Infinity", "1e999"):
        if rng.random() < 0.1:
            body = body.replace('"max_tokens": ', f'"temperature": {literal}, "max_tokens": ', 1)
    return body.encode()


def _request(rng: random.Random, keys: list[str]) -> tuple[bytes, bytes, bool]:
    """(head, body, stall): one fuzzed request."""
    kind = rng.random()
    if kind < 0.1:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 3000))), b"", False
    method = rng.choice(("POST",) * 6 + METHODS)
    model_path = rng.random() < 0.5 and method == "POST"
    path = (rng.choice(PATHS[:4]) if model_path else rng.choice(PATHS)) + rng.choice(
        ["", "", "", "?beta=true", "?" + "q" * 300, "/../x", "%00"])
    lines = [f"{method} {path} HTTP/1.{rng.choice([1, 1, 1, 0])}".encode()]
    if rng.random() < 0.8:
        lines.append(b"Host: 127.0.0.1")
    if rng.random() < 0.7:
        lines.append(b"Authorization: Bearer " + rng.choice(keys).encode())
        lines.append(b"Content-Type: application/json")
    body = _json_body(rng) if rng.random() < 0.85 else bytes(
        rng.getrandbits(8) for _ in range(rng.randint(0, 2000)))
    length = len(body) + rng.choice([0] * 8 + [-5, 7, 10**6])
    if rng.random() < 0.9:
        lines.append(b"Content-Length: " + str(max(0, length)).encode())
    else:
        lines.append(b"Transfer-Encoding: chunked")
        body = f"{len(body):x}\r\n".encode() + body + rng.choice([b"\r\n0\r\n\r\n", b"\r\nzz"])
    if rng.random() < 0.1:
        lines.append(b"Expect: 100-continue")
    for _ in range(rng.choice([0, 0, 1, 2, 6])):
        name = rng.choice([b"X-Fuzz", b"Content-Type", b"Connection", b"x-api-key",
                           b"Origin", b"Cookie"] * 3 + [b"Bad Header", b"\xff\xfe"])
        size = rng.choice([1, 10, 100, 1000, 4000, 4000, 70_000, 200_000] if rng.random() < 0.2
                          else [1, 10, 100, 1000])
        alphabet = b"abc =;:,/\xc3\xa9" if rng.random() < 0.9 else b"ab\t\x01\x7f"
        value = bytes(rng.choice(alphabet) for _ in range(size))
        lines.append(name + b": " + value)
    lines.append(b"Connection: close")
    head = b"\r\n".join(lines) + rng.choice([b"\r\n\r\n"] * 8 + [b"\n\n", b"\r\n"])
    return head, body, rng.random() < 0.05


def _hammer(px_port: int, rng: random.Random, keys: list[str], until: float,
            seen: list[tuple[int | None, str | None]]) -> None:
    while time.monotonic() < until:
        head, body, stall = _request(rng, keys)
        try:
            c = socket.create_connection(("127.0.0.1", px_port), timeout=5)
        except OSError:
            continue
        try:
            c.sendall(head)
            if not stall:
                for i in range(0, len(body), 4096):
                    c.sendall(body[i:i + 4096])
            answer = read_response(c, 3.0 if not stall else 2.5)
        except OSError:
            answer = b""
        finally:
            c.close()
        cycle = None
        if b"x-flowtrial-cycle-id: " in answer:
            cycle = answer.split(b"x-flowtrial-cycle-id: ", 1)[1].split(b"\r\n", 1)[0].decode()
        # Skip a 100 Continue to the final status line.
        final = answer.split(b"\r\n\r\n", 1)[1] if answer.startswith(b"HTTP/1.1 100") else answer
        seen.append((status_of(final), cycle))


def test_fuzzing_the_front_door_keeps_serving_and_recording(tmp_path: Path) -> None:
    seconds = float(os.environ.get("FLOWTRIAL_FUZZ_S", "20"))
    seed = int(os.environ.get("FLOWTRIAL_FUZZ_SEED", str(random.randrange(1 << 30))))
    log.warning("front-door fuzz: seed %d (FLOWTRIAL_FUZZ_SEED=%d replays it)", seed, seed)
    s = study(tmp_path, {"header_timeout_s": 1.0, "body_timeout_s": 1.0},
              extra={"capture": {"content": "full"}})
    seen: list[tuple[int | None, str | None]] = []
    with proxy(s) as px:
        keys = [s.keys["mallory"], s.keys["mallory"], "ft_not_a_key", ""]
        until = time.monotonic() + seconds
        threads = [threading.Thread(target=_hammer, args=(px.port, random.Random(seed + k),
                                                          keys, until, seen))
                   for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 60)
        statuses = [st for st, _ in seen]
        log.warning("front-door fuzz: %d requests, statuses %s", len(seen),
                    {k: statuses.count(k) for k in sorted(set(statuses), key=str)})
        answered = sorted({cid for _, cid in seen if cid})
        log.warning("front-door fuzz: %d answers carried a cycle id", len(answered))
        assert len(seen) > 50 and len(answered) >= 5, "the fuzzer hardly ran"
        assert 500 not in statuses, "the proxy answered 500"
        time.sleep(0.5)  # abandoned cycles are recorded as their connections close
        rows = dict(s.rows("SELECT id, status FROM cycles"))
        missing = set(answered) - set(rows)
        assert not missing, f"answered but not recorded: {missing}"
        unreceipted = {cid: st for cid, st in rows.items() if cid not in answered}
        assert set(unreceipted.values()) <= {"abandoned"}, unreceipted
        assert health(px)["status"] == "ok"
        still_serving(px, s, [*answered, *unreceipted])
