"""`flowtrial codex-notify`: Codex's end-of-turn notification posted to the proxy's OTLP
receiver as a `codex.agent_turn_complete` log, stored as a `turn_end` on the cycle that
ended the turn; nothing of what was said is sent; bad input is a one-line error, exit 2."""

from __future__ import annotations

import json
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from flowtrial.instrumentation.capture_commands import codex_notify
from flowtrial.instrumentation.proxy import serve_proxy
from tests.instrumentation.test_telemetry_receiver import a_cycle, events, last_id

pytest.importorskip("opentelemetry.proto", reason="needs the [telemetry] extra")

NOTE = {"type": "agent-turn-complete", "thread-id": "th-1", "turn-id": "tu-1",
        "cwd": "/secret/project", "client": "codex_exec",
        "input-messages": ["rename the function", "and its tests"],
        "last-assistant-message": "Renamed it in 3 files."}


def run(args: list[str], env: dict[str, str]) -> Any:
    app = typer.Typer()
    app.command()(codex_notify)
    return CliRunner().invoke(app, args, env=env)


def test_notification_lands_as_the_turns_end(make_study: Any) -> None:
    s = make_study()
    key = s.keys["p01"]
    with serve_proxy(s.db, s.config) as px:
        cid, _start, _end = a_cycle(s, px, key)
        since = last_id(s)
        r = run([json.dumps(NOTE), "--url", px.base_url], {"FLOWTRIAL_API_KEY": key})
        assert r.exit_code == 0, r.output
        (row,) = events(s, since)
        # wrong key: the proxy's 401, said in one line
        r = run([json.dumps(NOTE), "--url", px.base_url], {"FLOWTRIAL_API_KEY": "ft_nobody"})
        assert r.exit_code == 2 and "answered 401" in r.output
    assert (row[1], row[2], row[5], row[7]) == ("turn_end", cid, "otel", "p01")
    p = json.loads(row[6])
    assert p["otel"] == "codex.agent_turn_complete" and p["session_id"] == "th-1"
    assert (p["turn_id"], p["client"], p["input_messages"], p["input_length"]) == (
        "tu-1", "codex_exec", 2, len("rename the function") + len("and its tests"))
    assert "rename" not in row[6] and "secret" not in row[6] and "Renamed" not in row[6]
    assert len(events(s, since)) == 1


@pytest.mark.parametrize(("args", "env", "says"), [
    (["not json", "--url", "http://127.0.0.1:9"], {"FLOWTRIAL_API_KEY": "ft_x"}, "not JSON"),
    (['{"a": 1}', "--url", "http://127.0.0.1:9"], {"FLOWTRIAL_API_KEY": "ft_x"}, '"type"'),
    ([json.dumps(NOTE), "--url", "http://127.0.0.1:9"], {"FLOWTRIAL_API_KEY": ""},
     "$FLOWTRIAL_API_KEY is not set"),
    ([json.dumps(NOTE), "--url", "http://127.0.0.1:9"], {"FLOWTRIAL_API_KEY": "ft_x"},
     "cannot reach the proxy"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], env: dict[str, str], says: str) -> None:
    r = run(args, env)
    assert r.exit_code == 2 and says in r.output and len(r.output.strip().splitlines()) == 1
