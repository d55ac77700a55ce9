"""Two of issue #28's caps not covered elsewhere: event times refused by name (event API)
and the Responses WebSocket's idle timeout between turns (``proxy.ws_idle_timeout_s``)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from tests.security.frontdoor_helpers import MODEL, proxy, study

from .conftest import bearer, make_study, proxy_client


@pytest.mark.parametrize("ts", ["2255-01-01T00:00:00Z", 9e12, "1970-01-02T00:00:00Z"])
def test_event_times_out_of_range_are_refused_by_name(tmp_path: Path, ts: object) -> None:
    s = make_study(tmp_path)
    with proxy_client(s) as client:
        r = client.post("/flowtrial/v1/events", headers=bearer(s.keys["p01"]), json={
            "events": [{"kind": "custom"}, {"kind": "custom", "ts": ts}]})
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["param"] == "events[1]" and "events[1]: ts: " in err["message"], err
        assert "out of range" in err["message"]
        assert s.count("events") == 0  # nothing of the batch written


def _turn_then_idle(url: str, key: str, tokens: int) -> tuple[list[str], float, float, int | None,
                                                               str]:
    """One turn of ``tokens`` on a Responses WebSocket, then silence: (event types, turn
    seconds, seconds from its last event to the close, close code, reason)."""
    import websockets
    from websockets.asyncio.client import connect

    async def run() -> tuple[list[str], float, float, int | None, str]:
        async with connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
            t_start = time.monotonic()
            await ws.send(json.dumps({"type": "response.create", "model": MODEL,
                                      "input": "hi", "max_output_tokens": tokens}))
            kinds: list[str] = []
            t_last = time.monotonic()
            try:
                while True:  # the turn's events, then silence until the proxy closes
                    kinds.append(json.loads(await asyncio.wait_for(ws.recv(), 30))["type"])
                    t_last = time.monotonic()
            except websockets.ConnectionClosed as exc:
                assert exc.rcvd is not None
                return (kinds, t_last - t_start, time.monotonic() - t_last, exc.rcvd.code,
                        exc.rcvd.reason)

    return asyncio.run(run())


def test_websocket_idle_between_turns_is_closed_1000(tmp_path: Path) -> None:
    """Idle is counted between turns only: a turn longer than the timeout runs to its end,
    and the socket is closed about the timeout after it."""
    slow = {"arms": [{"name": "paced", "ttft_ms": 100.0, "tokens_per_second": 20.0}]}
    s = study(tmp_path, {"ws_idle_timeout_s": 1.0}, slow)  # ~40 tokens: about 2 s a turn
    with proxy(s) as px:
        url = px.base_url.replace("http://", "ws://") + "/v1/responses"
        for tokens in (5, 400):  # a short turn, then one as long as the arm allows
            kinds, turn_s, idle_s, code, reason = _turn_then_idle(url, s.keys["mallory"],
                                                                  tokens)
            # The turn ran to its end (its token limit), then the idle socket was closed.
            assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
            assert code == 1000 and "idle" in reason, (code, reason)
            assert 0.8 <= idle_s <= 5.0, (tokens, turn_s, idle_s)
        assert turn_s > 1.5, turn_s  # the long turn outlasted the timeout
