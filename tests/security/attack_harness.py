"""A bounded attack harness (issue #28): the proxy in its own process, a well-behaved
participant (p02, a shaped arm with a 100 ms TTFT floor) streaming chats from another
process, and each attack of the issue's table run from this one for a few seconds.

Used by ``tests/security/test_attacks.py`` (asserts) and ``benchmarks/bench_attacks.py``
(prints). Everything is loopback; payloads are built before an attack starts, so building
them never competes with the measurement; at most 1,100 connections are opened at once.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[2]
TTFT_FLOOR_MS = 100.0
#: The caps the arena's study sets (smaller than the defaults, so the test sees them bite).
STORED_PER_DAY = 8 * 1024 * 1024
RECORDS_PER_POST = 2000
VALUE_BYTES = 4096
STUDY = f"""
[study]
name = "attack-arena"
design = "parallel"

[[arms]]
name = "floor"
ttft_ms = {TTFT_FLOOR_MS}

[capture]
content = "none"

[upstream.openai]
base_url = "{{mock}}"
api_key_env = "FLOWTRIAL_ARENA_UPSTREAM_KEY"

[proxy]
max_stored_bytes_per_day = {STORED_PER_DAY}
max_records_per_post = {RECORDS_PER_POST}
max_value_bytes = {VALUE_BYTES}
"""

VICTIM = r"""
import json, re, sys, time, httpx
base, key, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
out = []
end = time.monotonic() + seconds
i = 0
with httpx.Client(base_url=base, timeout=60,
                  headers={"authorization": "Bearer " + key}) as client:
    while time.monotonic() < end:
        i += 1
        t0 = time.monotonic()
        rec = {"ttft_ms": None, "status": None, "cycle": None, "error": None}
        try:
            with client.stream("POST", "/v1/chat/completions", json={
                    "model": "m", "stream": True,
                    "messages": [{"role": "user", "content": f"hello {i}"}]}) as r:
                rec["status"] = r.status_code
                rec["cycle"] = r.headers.get("x-flowtrial-cycle-id")
                for line in r.iter_lines():
                    if rec["ttft_ms"] is None and re.search('"content":"[^"]', line):
                        rec["ttft_ms"] = (time.monotonic() - t0) * 1000
                    if line.strip() == "data: [DONE]":
                        rec["done"] = True
        except Exception as exc:
            rec["error"] = type(exc).__name__ + ": " + str(exc)[:200]
        out.append(rec)
        time.sleep(0.05)
print(json.dumps(out))
"""


@dataclass
class Arena:
    base_url: str
    db: Path
    keys: dict[str, str]
    pid: int

    def scalar(self, sql: str, **params: Any) -> Any:
        engine = create_engine(f"sqlite:///{self.db}")
        try:
            with engine.connect() as conn:
                return conn.execute(text(sql), params).scalar()
        finally:
            engine.dispose()

    def stored(self, pid: str = "p01") -> tuple[int, int]:
        """(rows, payload bytes) of the participant's events."""
        engine = create_engine(f"sqlite:///{self.db}")
        try:
            with engine.connect() as conn:
                n, size = conn.execute(text(
                    "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload_json)), 0) FROM events "
                    "WHERE participant_id = :p"), {"p": pid}).one()
            return int(n), int(size)
        finally:
            engine.dispose()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _started(args: list[str], pattern: str, env: dict[str, str], nice: int = 0
             ) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, cwd=ROOT, preexec_fn=(lambda: os.nice(nice)) if nice
                            else None)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(pattern, line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain
            return proc, m.group(1)
    proc.kill()
    raise RuntimeError(f"{args[:3]} did not start")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


@contextmanager
def arena(directory: Path) -> Iterator[Arena]:
    """The study (p01 attacks, p02 is well-behaved), the simulated model in its own process at
    nice 10 (a real upstream is another machine: its work must not take the proxy's CPU here)
    and the proxy in another."""
    from flowtrial.study.config import load_study
    from flowtrial.study.participants import enroll
    from flowtrial.study.storage import init_db

    env = {**_env(), "FLOWTRIAL_ARENA_UPSTREAM_KEY": "sk-arena"}
    mock, mock_url = _started([sys.executable, "-c", "import typer; from flowtrial."
                               "instrumentation.mock_model.commands import mock_model; "
                               "typer.run(mock_model)", "--port", "0", "--ttft-ms", "0",
                               "--tokens-per-second", "2000"],
                              r"simulated model at (http://\S+/v1)", env, nice=10)
    try:
        toml = STUDY.replace("{mock}", mock_url)
        study = directory / "study.toml"
        study.write_text(toml, encoding="utf-8")
        db = directory / "arena.db"
        config = load_study(study)
        database = init_db(db, config, toml)
        keys = {p: enroll(database, config, p)[1] for p in ("p01", "p02")}
        database.dispose()
        proc, url = _started([sys.executable, "-m", "flowtrial.proxy_assembly", "--study",
                              str(study), "--db", str(db), "--port", "0"],
                             r"OPENAI_BASE_URL=(http://\S+)/v1", env)
        try:
            yield Arena(url, db, keys, proc.pid)
        finally:
            _stop(proc)
    finally:
        _stop(mock)


# -- payloads (built before an attack starts) ---------------------------------------------
def _otlp_logs_json(n: int, attr: str = "", seed: int = 0) -> bytes:
    now = time.time_ns()
    recs = [{"timeUnixNano": str(now + i), "body": {"stringValue": "claude_code.probe"},
             "attributes": ([{"key": "blob", "value": {"stringValue": attr}}] if attr else [])
             + [{"key": "i", "value": {"intValue": str(seed * 1_000_000 + i)}}]}
            for i in range(n)]
    doc = {"resourceLogs": [{"resource": {"attributes": []},
                             "scopeLogs": [{"scope": {"name": "x"}, "logRecords": recs}]}]}
    return gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)


def _otlp_logs_proto(n: int) -> bytes:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
        ExportLogsServiceRequest,
    )

    req = ExportLogsServiceRequest()
    logs = req.resource_logs.add().scope_logs.add().log_records
    now = time.time_ns()
    for i in range(n):
        r = logs.add()
        r.time_unix_nano = now + i
        r.body.string_value = "p"
    return req.SerializeToString()


def _ws_handshake(key: str) -> bytes:
    nonce = base64.b64encode(os.urandom(16)).decode()
    return ("GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Key: {nonce}\r\nAuthorization: Bearer {key}\r\n\r\n").encode()


# -- attacks ------------------------------------------------------------------------------
@dataclass
class Attack:
    name: str
    prepare: Callable[[Arena], Any]  # builds payloads (not timed)
    run: Callable[[Arena, Any, float], dict[str, int]]  # status counts (or notes)


def _posts(arena: Arena, path: str, body: bytes, headers: dict[str, str], n: int,
           parallel: int, deadline: float) -> dict[str, int]:
    """``n`` posts of ``body`` (``parallel`` at once) as p01; counts of statuses."""
    counts: dict[str, int] = {}
    lock = threading.Lock()
    todo = list(range(n))

    def worker() -> None:
        with httpx.Client(base_url=arena.base_url, timeout=60) as client:
            while time.monotonic() < deadline:
                with lock:
                    if not todo:
                        return
                    todo.pop()
                try:
                    r = client.post(path, content=body, headers={
                        "authorization": f"Bearer {arena.keys['p01']}", **headers})
                    key = str(r.status_code)
                except httpx.HTTPError as exc:
                    key = type(exc).__name__
                with lock:
                    counts[key] = counts.get(key, 0) + 1

    threads = [threading.Thread(target=worker) for _ in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts


def _post_attack(path: str, headers: dict[str, str], n: int, parallel: int
                 ) -> Callable[[Arena, Any, float], dict[str, int]]:
    def run(arena: Arena, body: Any, seconds: float) -> dict[str, int]:
        if isinstance(body, list):  # distinct bodies: one post each
            out: dict[str, int] = {}
            deadline = time.monotonic() + seconds
            for b in body:
                for k, v in _posts(arena, path, b, headers, 1, 1, deadline).items():
                    out[k] = out.get(k, 0) + v
            return out
        return _posts(arena, path, body, headers, n, parallel, time.monotonic() + seconds)
    return run


def _events_body(_: Arena) -> bytes:
    return json.dumps({"events": [{"kind": "custom", "payload": {"x": [0] * 4_900_000}}]},
                      separators=(",", ":")).encode()


def _continue_body(_: Arena) -> bytes:
    return json.dumps({"name": "autocomplete", "schema": "0.2.0", "level": "all",
                       "data": {"accepted": True, "completionId": "c1",
                                "completion": "x" * 9_800_000}}).encode()


def _bomb(_: Arena) -> bytes:
    return gzip.compress(b"\0" * (100 * 1024 * 1024), 9)


def _big_prompts(_: Arena) -> list[bytes]:
    big = json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "y" * 9_500_000}]}).encode()
    many = json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "hi"}] * 200_000}).encode()
    return [big] * 8 + [many] * 4


def _run_big_prompts(arena: Arena, bodies: list[bytes], seconds: float) -> dict[str, int]:
    deadline = time.monotonic() + seconds
    out: dict[str, int] = {}
    for body in bodies[:8], bodies[8:]:
        for k, v in _posts(arena, "/v1/chat/completions", body[0], {
                "content-type": "application/json"}, len(body), len(body), deadline).items():
            out[k] = out.get(k, 0) + v
    return out


def _preauth_flood(arena: Arena, _: Any, seconds: float) -> dict[str, int]:
    host, port = arena.base_url.removeprefix("http://").rsplit(":", 1)
    socks: list[socket.socket] = []
    opened = refused = 0
    deadline = time.monotonic() + seconds
    for _i in range(1100):
        try:
            s = socket.create_connection((host, int(port)), timeout=2)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
            opened += 1
        except OSError:
            refused += 1
    while time.monotonic() < deadline:  # keep trickling header bytes
        for s in socks:
            with suppress(OSError):
                s.send(b"X-a: b\r\n")
        time.sleep(1.0)
    for s in socks:
        s.close()
    return {"opened": opened, "connect_failed": refused}


def _idle_websockets(arena: Arena, _: Any, seconds: float) -> dict[str, int]:
    host, port = arena.base_url.removeprefix("http://").rsplit(":", 1)
    socks: list[socket.socket] = []
    counts: dict[str, int] = {}
    for _i in range(999):
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(_ws_handshake(arena.keys["p01"]))
            head = s.recv(200).split(b"\r\n", 1)[0].decode("latin-1")
            status = head.split(" ")[1] if " " in head else "none"
            counts[status] = counts.get(status, 0) + 1
            socks.append(s)
        except OSError as exc:
            counts[type(exc).__name__] = counts.get(type(exc).__name__, 0) + 1
    time.sleep(max(0.0, seconds - 2))
    for s in socks:
        s.close()
    return counts


def _big_socket_messages(_: Arena) -> list[str]:
    """Two 7 MB WebSocket messages the proxy must read whole before refusing them: a
    ``response.cancel`` of 200k short items and the same ``response.create`` cut short."""
    items = [{"role": "user", "content": "hi"}] * 200_000
    create = json.dumps({"type": "response.create", "model": "m", "input": items})
    return [create.replace("response.create", "response.cancel", 1), create[:-1]]


def _socket_reads(arena: Arena, messages: list[str], seconds: float) -> dict[str, int]:
    """Three WebSocket connections of p01 sending ``messages`` in turn; counts of the error
    codes that came back."""
    from websockets.sync.client import connect

    url = arena.base_url.replace("http://", "ws://") + "/v1/responses"
    deadline = time.monotonic() + seconds
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def worker() -> None:
        with connect(url, additional_headers={"authorization": f"Bearer {arena.keys['p01']}"},
                     max_size=None, compression=None, open_timeout=30) as ws:
            i = 0
            while time.monotonic() < deadline:
                ws.send(messages[i % len(messages)])
                i += 1
                ev = json.loads(ws.recv(timeout=60))
                key = ev.get("error", {}).get("code") or ev["type"]
                with lock:
                    counts[key] = counts.get(key, 0) + 1

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts


def _big_attributes(_: Arena) -> list[bytes]:
    return [_otlp_logs_json(1, attr="A" * (8 * 1024 * 1024), seed=k) for k in range(20)]


ATTACKS: list[Attack] = [
    Attack("events_9.8MB", _events_body, _post_attack(
        "/flowtrial/v1/events", {"content-type": "application/json"}, 6, 6)),
    Attack("continue_9.8MB", _continue_body, _post_attack(
        "/flowtrial/v1/continue", {"content-type": "application/json"}, 4, 4)),
    Attack("otlp_json_350k", lambda a: _otlp_logs_json(350_000), _post_attack(
        "/flowtrial/otlp/v1/logs", {"content-type": "application/json",
                                    "content-encoding": "gzip"}, 1, 1)),
    Attack("otlp_proto_400k", lambda a: _otlp_logs_proto(400_000), _post_attack(
        "/flowtrial/otlp/v1/logs", {"content-type": "application/x-protobuf"}, 1, 1)),
    Attack("otlp_gzip_bombs", _bomb, _post_attack(
        "/flowtrial/otlp/v1/logs", {"content-type": "application/x-protobuf",
                                    "content-encoding": "gzip"}, 20, 4)),
    Attack("large_model_bodies", _big_prompts, _run_big_prompts),
    Attack("websocket_7MB_reads", _big_socket_messages, _socket_reads),
    Attack("preauth_flood_1100", lambda a: None, _preauth_flood),
    Attack("idle_websockets_999", lambda a: None, _idle_websockets),
    Attack("otlp_8MB_attribute", _big_attributes, _post_attack(
        "/flowtrial/otlp/v1/logs", {"content-type": "application/json",
                                    "content-encoding": "gzip"}, 20, 1)),
]


# -- measurement ----------------------------------------------------------------------------
@dataclass
class Outcome:
    name: str
    ttft_ms: list[float]
    failed: list[dict[str, Any]]
    unrecorded: int
    attack: dict[str, int]
    stored_rows: int
    stored_bytes: int
    #: p02's upstream time to first token (the shared simulated model's) and how late the
    #: proxy released the first token after max(floor, upstream's first): the proxy's part.
    upstream_ms: list[float] = field(default_factory=list)
    proxy_late_ms: list[float] = field(default_factory=list)

    def p(self, q: float, of: str = "ttft_ms") -> float:
        xs = sorted(getattr(self, of))
        if not xs:
            return float("nan")
        return xs[min(len(xs) - 1, round((len(xs) - 1) * q / 100))]


def _victim(arena: Arena, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", VICTIM, arena.base_url, arena.keys["p02"],
                             str(seconds)], stdout=subprocess.PIPE, text=True, env=_env())


def measure(arena: Arena, attack: Attack | None, seconds: float = 8.0) -> Outcome:
    """p02's streamed chats for ``seconds`` while ``attack`` runs (None: quiet)."""
    payload = attack.prepare(arena) if attack is not None else None
    victim = _victim(arena, seconds)
    time.sleep(0.5)  # the victim is up and streaming before the attack starts
    counts = attack.run(arena, payload, seconds - 1.0) if attack is not None else {}
    out, _ = victim.communicate(timeout=seconds + 120)
    runs = json.loads(out)
    ok = [r for r in runs if r["status"] == 200 and r.get("done") and r["ttft_ms"]]
    failed = [r for r in runs if r not in ok]
    cycles = [r["cycle"] for r in ok if r["cycle"]]
    engine = create_engine(f"sqlite:///{arena.db}")
    try:
        with engine.connect() as conn:
            timing = {row[0]: row[1:] for row in conn.execute(text(
                "SELECT id, t_request_ns, t_upstream_first_ns, t_first_sent_ns FROM cycles "
                "WHERE participant_id = 'p02'"))}
    finally:
        engine.dispose()
    rows, size = arena.stored("p01")
    floor_ns = TTFT_FLOOR_MS * 1e6
    upstream, late = [], []
    for c in cycles:
        if c in timing and None not in timing[c]:
            t_req, t_up, t_sent = timing[c]
            upstream.append((t_up - t_req) / 1e6)
            late.append((t_sent - max(t_req + floor_ns, t_up)) / 1e6)
    return Outcome(attack.name if attack else "quiet", [r["ttft_ms"] for r in ok], failed,
                   sum(1 for c in cycles if c not in timing) + (len(ok) - len(cycles)),
                   counts, rows, size, upstream_ms=upstream, proxy_late_ms=late)
