"""Per-arm models: named upstreams (``[upstreams.NAME]``) and an arm's ``model`` replacing
the client's. A study with two arms on two models (and two simulated upstreams) records
both, the requested and the served model, over the OpenAI SDK, Gemini's model-in-the-URL
and the Responses WebSocket mode; an arm naming an undefined upstream is refused by
``flowtrial validate``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from google import genai
from google.genai import types
from typer.testing import CliRunner
from websockets.sync.client import connect as ws_connect

from flowtrial.cli import app as cli
from flowtrial.instrumentation.proxy import serve_proxy

pytestmark = pytest.mark.usefixtures("fine_gil_switching")
PEOPLE = tuple(f"p{i:02d}" for i in range(1, 7))
ARMS = {"spark": "sim-spark", "codex": "sim-codex"}


@pytest.fixture(scope="module")
def served(make_study_module) -> Iterator[tuple]:
    s = make_study_module({
        "upstreams": {"fast": {"kind": "mock", "mock": {"tokens_per_second": 20000}},
                      "slow": {"kind": "mock", "mock": {"tokens_per_second": 5000}}},
        "arms": [{"name": "spark", "upstream": "fast", "model": ARMS["spark"]},
                 {"name": "codex", "upstream": "slow", "model": ARMS["codex"]}],
        "capture": {"content": "full"}}, participants=PEOPLE)
    with serve_proxy(s.db, s.config) as px:
        yield s, px


def test_two_arms_on_two_models_record_both(served) -> None:
    s, px = served
    answered = {}
    for pid, key in s.keys.items():
        c = openai.OpenAI(base_url=px.base_url + "/v1", api_key=key, max_retries=0)
        r = c.chat.completions.create(model="client-model", max_tokens=8, messages=[
            {"role": "user", "content": "sort a list"}])
        answered[pid] = r.model  # the simulated model names the model it was asked for
        g = genai.Client(api_key=key, http_options=types.HttpOptions(
            base_url=px.base_url, api_version="v1beta"))
        assert g.models.generate_content(model="gemini-client", contents="hello").text
    rows = [r._mapping for r in s.rows(
        "SELECT participant_id, arm, protocol, model, served_model, upstream FROM cycles")]
    assert len(rows) == 2 * len(PEOPLE)
    assert {r["arm"] for r in rows} == set(ARMS)  # both arms drawn among six people
    for r in rows:
        assert r["model"] == ("client-model" if r["protocol"] == "chat" else "gemini-client")
        assert r["served_model"] == ARMS[r["arm"]]
        assert r["upstream"] == {"spark": "mock:fast", "codex": "mock:slow"}[r["arm"]]
        if r["protocol"] == "chat":
            assert answered[r["participant_id"]] == ARMS[r["arm"]]


def test_websocket_turns_take_their_arms_model(served) -> None:
    """The Responses WebSocket mode: each turn goes to its arm's upstream, asking its model."""
    s, px = served
    for key in s.keys.values():
        with ws_connect(px.base_url.replace("http://", "ws://") + "/v1/responses",
                        additional_headers={"authorization": f"Bearer {key}"}) as ws:
            ws.send(json.dumps({"type": "response.create", "model": "client-model",
                                "input": "hello", "max_output_tokens": 8}))
            while (ev := json.loads(ws.recv(timeout=20)))["type"] not in (
                    "response.completed", "response.incomplete"):
                pass
            assert ev["response"]["model"] in ARMS.values()
    rows = [r._mapping for r in s.rows(
        "SELECT arm, model, served_model, upstream FROM cycles WHERE transport = 'websocket'")]
    assert len(rows) == len(PEOPLE)
    for r in rows:
        assert (r["model"], r["served_model"]) == ("client-model", ARMS[r["arm"]])
        assert r["upstream"] == {"spark": "mock:fast", "codex": "mock:slow"}[r["arm"]]


def test_validate_refuses_an_unknown_upstream(tmp_path: Path) -> None:
    study = tmp_path / "study.toml"
    study.write_text('[study]\nname = "x"\ndesign = "parallel"\n[upstreams.fast]\n'
                     'kind = "mock"\n[[arms]]\nname = "a"\nupstream = "fats"\n',
                     encoding="utf-8")
    r = CliRunner().invoke(cli, ["validate", "--study", str(study)])
    assert r.exit_code == 2, r.output
    assert "arm 'a' names upstream 'fats', which is not defined" in r.output
    assert "(defined: fast)" in r.output and "Traceback" not in r.output
