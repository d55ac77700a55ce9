"""Helpers for the front-door tests: a real proxy on a free loopback port, raw sockets for the
attacks, and the two checks every attack is followed by — another participant's stream is
still within its shaping target, and every answer the proxy completed is recorded."""

from __future__ import annotations

import json
import logging
import select
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai

from flowtrial.instrumentation.proxy import serve_proxy
from flowtrial.instrumentation.proxy.server import ProxyHandle
from tests.instrumentation.conftest import StudySetup, build_study

log = logging.getLogger("tests.front_door")
MODEL = "flowtrial-sim-1"
#: The normal participant's arm: a 150 ms first token, then 200 tokens/s (40 tokens ≈ 345 ms).
TTFT_MS, TPS, TOKENS = 150.0, 200.0, 40
#: How far past its target the normal stream may end on a busy 2-core machine. The attacks
#: this guards against stalled it by 5.8-87 s (issue 19); a loaded CI box adds well under 1 s.
SLACK_MS = 1500.0
PACED = {"arms": [{"name": "paced", "ttft_ms": TTFT_MS, "tokens_per_second": TPS}],
         "upstream": {"kind": "mock", "mock": {"tokens_per_second": 1e6, "ttft_ms": 0}}}


def study(directory: Path, proxy: dict[str, Any] | None = None,
          extra: dict[str, Any] | None = None, where: str | Path | None = None) -> StudySetup:
    """Alice (the normal participant) and Mallory (the attacker, a real participant key)."""
    overrides: dict[str, Any] = {**PACED, "proxy": proxy or {}, **(extra or {})}
    return build_study(directory, overrides, participants=("alice", "mallory"), where=where)


@contextmanager
def proxy(s: StudySetup) -> Iterator[ProxyHandle]:
    with serve_proxy(s.db, s.config, grace_s=3) as px:
        yield px


def raw(px: ProxyHandle, timeout: float = 10.0) -> socket.socket:
    c = socket.create_connection(("127.0.0.1", px.port), timeout=timeout)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def read_response(c: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes (or ``timeout``)."""
    c.settimeout(timeout)
    out = b""
    try:
        while chunk := c.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionError):
        pass
    return out


def status_of(response: bytes) -> int | None:
    if not response.startswith(b"HTTP/1."):
        return None
    return int(response.split(b" ", 2)[1])


def send_until_answered(c: socket.socket, head: bytes, filler: bytes, total: int
                        ) -> tuple[bytes, int]:
    """Send ``head`` then ``filler`` up to ``total`` bytes, stopping as soon as the server
    answers; (its answer, bytes sent)."""
    c.sendall(head)
    sent = len(head)
    while sent < total:
        readable, _, _ = select.select([c], [], [], 0)
        if readable:
            break
        try:
            c.sendall(filler)
        except OSError:
            break
        sent += len(filler)
    return read_response(c), sent


def health(px: ProxyHandle) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(px.base_url + "/flowtrial/v1/health", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def normal_stream(px: ProxyHandle, key: str) -> str:
    """Alice's ordinary streamed chat with the official SDK; returns its cycle id."""
    client = openai.OpenAI(base_url=px.base_url + "/v1", api_key=key, max_retries=0,
                           timeout=30)
    raw_reply = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "write a python stack class"}],
        stream=True, max_tokens=TOKENS)
    cycle_id = raw_reply.headers["x-flowtrial-cycle-id"]
    text = "".join(ch.choices[0].delta.content or "" for ch in raw_reply.parse()
                   if ch.choices)
    assert text, "the normal participant got no answer"
    return cycle_id


def assert_served_within_target(s: StudySetup, cycle_id: str) -> None:
    """Alice's cycle is recorded ``ok`` and on target: first token no earlier than the
    target, last token within SLACK_MS of when the target says."""
    rows = s.rows("SELECT status, experienced_ttft_ms, generation_wait_ms, tokens_sent "
                  "FROM cycles WHERE id = :id", {"id": cycle_id})
    assert rows, f"cycle {cycle_id} was answered but not recorded"
    status, ttft, wait, tokens = rows[0]
    assert status == "ok"
    target_wait = TTFT_MS + (tokens - 1) / TPS * 1000
    log.info("normal stream: ttft %.1f ms (target %.0f), wait %.1f ms (target %.0f)",
             ttft, TTFT_MS, wait, target_wait)
    assert ttft >= TTFT_MS - 1.0
    assert wait <= target_wait + SLACK_MS, (
        f"the normal stream took {wait:.0f} ms, its target {target_wait:.0f} ms")


def assert_all_answers_recorded(s: StudySetup, answered: list[str]) -> None:
    """Every cycle id a client received is a row; no row without one."""
    ids = {r[0] for r in s.rows("SELECT id FROM cycles")}
    assert set(answered) <= ids, f"answered but not recorded: {set(answered) - ids}"
    assert ids <= set(answered), f"rows no client was answered for: {ids - set(answered)}"


def still_serving(px: ProxyHandle, s: StudySetup, answered: list[str]) -> None:
    """The two checks after every attack (see the module docstring)."""
    deadline = time.monotonic() + 30
    while health(px)["status"] == "unavailable":  # never expected: fail after a while
        assert time.monotonic() < deadline, "the proxy stayed unavailable"
        time.sleep(0.1)
    cid = normal_stream(px, s.keys["alice"])
    answered.append(cid)
    assert_served_within_target(s, cid)
    assert_all_answers_recorded(s, answered)
