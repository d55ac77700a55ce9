"""Durable recording: every request is a cycle, the final event waits for the row, failures
are recorded and fail loudly, abandoned streams keep what was sent."""

from __future__ import annotations

import json
import time
from concurrent.futures import Future
from typing import Any

import httpx
import openai
import pytest

from flowtrial.instrumentation.proxy import create_proxy_app, serve_proxy
from flowtrial.study.schema import Cycle
from flowtrial.study.storage import RecordWriter, StorageError, WriteBatch
from tests.instrumentation.proxy_servers import closed_port, silent_server
from tests.instrumentation.servers import run_asgi_server

# Recording and reading back are storage paths: run them on SQLite and PostgreSQL.
pytestmark = pytest.mark.both_backends

MODEL = "flowtrial-sim-1"
MSG = [{"role": "user", "content": "write a python class for a stack"}]


def wait_for_rows(s, sql: str, n: int = 1, timeout: float = 5.0) -> list:
    deadline = time.monotonic() + timeout
    while True:
        rows = s.rows(sql)
        if len(rows) >= n or time.monotonic() > deadline:
            return rows
        time.sleep(0.02)


class FailingCycleWriter(RecordWriter):
    """A writer whose cycle rows never become durable (a full disk, a broken database)."""

    def submit(self, *batches: WriteBatch, bulk: bool = False) -> Future[None]:
        if any(b.table is Cycle for b in batches):
            fut: Future[None] = Future()
            fut.set_exception(StorageError("disk I/O error"))
            return fut
        return super().submit(*batches, bulk=bulk)


def test_client_closing_mid_stream_records_abandoned(make_study) -> None:
    s = make_study({"arms": [{"name": "slow", "ttft_ms": 20, "tokens_per_second": 40}],
                    "upstream": {"mock": {"tokens_per_second": 20000, "ttft_ms": 1}}})
    with serve_proxy(s.db, s.config) as px, httpx.Client(timeout=10) as http:
        body = {"model": MODEL, "messages": MSG, "stream": True, "max_tokens": 200}
        seen = 0
        with http.stream("POST", px.base_url + "/v1/chat/completions", json=body,
                         headers={"authorization": f"Bearer {s.key}"}) as r:
            cid = r.headers["x-flowtrial-cycle-id"]
            for line in r.iter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    seen += 1
                    if seen == 3:
                        break  # leaving the block closes the connection mid-stream
        rows = wait_for_rows(s, f"SELECT status, tokens_sent, http_status, error, "
                                f"content_chars, t_first_sent_ns FROM cycles WHERE id = '{cid}'")
    status, sent, http_status, error, chars, first = rows[0]
    assert status == "abandoned" and http_status == 200 and error == "client disconnected"
    assert 3 <= sent < 20 and chars > 0 and first is not None


def test_final_event_waits_for_a_durable_record(make_study) -> None:
    """If the cycle cannot be written the client never gets [DONE] (nor a 200 body)."""
    s = make_study({"upstream": {"mock": {"tokens_per_second": 20000, "ttft_ms": 1}}})
    writer = FailingCycleWriter(s.database.engine)
    app = create_proxy_app(s.database, s.config, writer=writer)
    try:
        with run_asgi_server(app) as url:
            body = {"model": MODEL, "messages": MSG, "stream": True, "max_tokens": 10}
            r = httpx.post(url + "/v1/chat/completions", json=body,
                           headers={"authorization": f"Bearer {s.key}"})
            assert "[DONE]" not in r.text
            last = [ln for ln in r.text.splitlines() if ln.startswith("data: ")][-1]
            assert json.loads(last[6:])["error"]["code"] == "recording_failed"
            c = openai.OpenAI(base_url=url + "/v1", api_key=s.key, max_retries=0)
            with pytest.raises(openai.APIError, match="could not record"):
                list(c.chat.completions.create(model=MODEL, messages=MSG, stream=True,
                                               max_tokens=5))
            with pytest.raises(openai.InternalServerError) as exc:
                c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=5)
            assert exc.value.status_code == 503
            events = list(c.responses.create(model=MODEL, input="x", stream=True,
                                             max_output_tokens=5))
            assert events[-1].type == "error" and "response.completed" not in {
                e.type for e in events}
    finally:
        writer.close()
    assert s.rows("SELECT count(*) FROM cycles")[0][0] == 0


def test_upstream_down_is_502_and_recorded(make_study, monkeypatch) -> None:
    monkeypatch.setenv("FT_TEST_UPSTREAM_KEY", "sk-test-secret-value")
    s = make_study({"upstream": {"kind": "openai", "api_key_env": "FT_TEST_UPSTREAM_KEY",
                                 "base_url": f"http://127.0.0.1:{closed_port()}/v1"}})
    with serve_proxy(s.db, s.config) as px:
        c = openai.OpenAI(base_url=px.base_url + "/v1", api_key=s.key, max_retries=0)
        with pytest.raises(openai.APIStatusError) as exc:
            c.chat.completions.create(model="gpt-x", messages=MSG, stream=True)
        assert exc.value.status_code == 502
        assert exc.value.response.headers["x-flowtrial-cycle-id"].startswith("cyc_")
        # The proxy keeps serving.
        health = httpx.get(px.base_url + "/flowtrial/v1/health").json()
        assert health["status"] == "ok" and health["errors"] >= 1
    rows = s.rows("SELECT status, http_status, error, upstream FROM cycles")
    assert [(r[0], r[1]) for r in rows] == [("upstream_error", 502)]
    assert "sk-test-secret-value" not in json.dumps([list(r) for r in rows])
    assert rows[0][3].startswith("openai:")


def test_upstream_silent_is_504_and_recorded(make_study, monkeypatch) -> None:
    monkeypatch.setenv("FT_TEST_UPSTREAM_KEY", "sk-test")
    with silent_server() as port:
        s = make_study({"upstream": {"kind": "openai", "api_key_env": "FT_TEST_UPSTREAM_KEY",
                                     "base_url": f"http://127.0.0.1:{port}/v1",
                                     "timeout_s": 0.3}})
        with serve_proxy(s.db, s.config) as px:
            r = httpx.post(px.base_url + "/v1/chat/completions", timeout=10,
                           json={"model": "m", "messages": MSG},
                           headers={"authorization": f"Bearer {s.key}"})
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    assert [tuple(x) for x in s.rows("SELECT status, http_status FROM cycles")] == [
        ("upstream_error", 504)]


def test_upstream_client_error_is_forwarded_and_recorded(make_study) -> None:
    s = make_study()
    with serve_proxy(s.db, s.config) as px:
        r = httpx.post(px.base_url + "/v1/chat/completions", json={"model": MODEL},
                       headers={"authorization": f"Bearer {s.key}"})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    status, http_status, error = s.rows("SELECT status, http_status, error FROM cycles")[0]
    assert (status, http_status) == ("error", 400) and "messages" in error


@pytest.mark.parametrize("mode", ["none", "fingerprint", "full"])
def test_capture_modes(make_study, mode: str) -> None:
    s = make_study({"capture": {"content": mode}})
    with serve_proxy(s.db, s.config) as px:
        c = openai.OpenAI(base_url=px.base_url + "/v1", api_key=s.key, max_retries=0)
        c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=20)
    pf, cf, pt, ct = s.rows("SELECT prompt_fingerprint, content_fingerprint, prompt_text, "
                            "content_text FROM cycles")[0]
    assert (pf is not None, cf is not None) == ((mode != "none"),) * 2
    assert (pt is not None, ct is not None) == ((mode == "full"),) * 2
    if mode != "none":
        assert all(isinstance(h, int) for h in json.loads(cf))


def wait_open(px: Any, timeout: float = 20.0) -> None:
    """Until the proxy has a cycle in flight: a fixed sleep is too short on a loaded machine
    (the client thread may not even have connected when the server stops listening)."""
    deadline = time.monotonic() + timeout
    while not px.state.open_cycles:
        assert time.monotonic() < deadline, "the request never reached the proxy"
        time.sleep(0.01)


def test_open_streams_finish_on_shutdown(make_study) -> None:
    """Leaving serve_proxy lets a running stream finish and records it."""
    import threading

    s = make_study({"arms": [{"name": "slow", "ttft_ms": 300}],
                    "upstream": {"mock": {"tokens_per_second": 20000, "ttft_ms": 1}}})
    out: dict[str, str] = {}

    def run(url: str) -> None:
        r = httpx.post(url + "/v1/chat/completions", timeout=10,
                       json={"model": MODEL, "messages": MSG, "stream": True, "max_tokens": 5},
                       headers={"authorization": f"Bearer {s.key}"})
        out["text"] = r.text

    with serve_proxy(s.db, s.config, grace_s=5) as px:
        t = threading.Thread(target=run, args=(px.base_url,))
        t.start()
        wait_open(px)  # the stream is open, held by the 300 ms floor
    t.join()
    assert out["text"].rstrip().endswith("data: [DONE]")
    assert s.rows("SELECT status FROM cycles")[0][0] == "ok"


def test_stream_outliving_the_grace_period_is_recorded_abandoned(make_study) -> None:
    import threading

    s = make_study({"arms": [{"name": "slow", "ttft_ms": 5000}],
                    "upstream": {"mock": {"tokens_per_second": 20000, "ttft_ms": 1}}})
    out: dict[str, object] = {}

    def run(url: str) -> None:
        try:
            r = httpx.post(url + "/v1/chat/completions", timeout=20,
                           json={"model": MODEL, "messages": MSG, "stream": True,
                                 "max_tokens": 5},
                           headers={"authorization": f"Bearer {s.key}"})
            out["text"] = r.text
        except httpx.HTTPError as exc:
            out["error"] = exc

    t0 = time.monotonic()
    with serve_proxy(s.db, s.config, grace_s=1) as px:
        t = threading.Thread(target=run, args=(px.base_url,))
        t.start()
        wait_open(px)  # open, held by the 5 s floor
    t.join()
    assert time.monotonic() - t0 < 4.5  # did not wait for the 5 s floor
    assert "[DONE]" not in str(out.get("text", ""))
    status, error, http_status = s.rows("SELECT status, error, http_status FROM cycles")[0]
    assert (status, http_status) == ("abandoned", 200) and "shut down" in error
