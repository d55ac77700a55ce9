"""The simulated model under a real uvicorn server, driven by the official SDKs and clients."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
import typer
from typer.testing import CliRunner
from websockets.sync.client import connect

from flowtrial.instrumentation.mock_model import MockModel
from flowtrial.instrumentation.mock_model.app import create_mock_app
from flowtrial.instrumentation.mock_model.commands import mock_model
from flowtrial.instrumentation.tokens import count_tokens
from tests.instrumentation.servers import run_asgi_server

KEY = "sk-not-needed"


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    model = MockModel(tokens_per_second=20000, ttft_ms=5, seed=11)
    with run_asgi_server(create_mock_app(model)) as url:
        yield url


@pytest.fixture(scope="module")
def oai(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def claude(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key=KEY, max_retries=0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


USER = [{"role": "user", "content": "Show me a Python context manager"}]


# ------------------------------------------------------------------------- OpenAI


def test_openai_chat_sync_plain_and_streaming(oai: openai.OpenAI) -> None:
    done = oai.chat.completions.create(model="flowtrial-sim-1", messages=USER)
    text = done.choices[0].message.content
    assert done.id.startswith("chatcmpl-") and text
    assert done.choices[0].finish_reason == "stop"
    assert done.usage.completion_tokens == count_tokens(text)

    stream = oai.chat.completions.create(
        model="flowtrial-sim-1", messages=USER, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == count_tokens(text)


def test_openai_chat_stream_helper_and_max_tokens(oai: openai.OpenAI) -> None:
    with oai.chat.completions.stream(model="anything", messages=USER) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(deltas) == final.choices[0].message.content

    cut = oai.chat.completions.create(model="anything", messages=USER, max_completion_tokens=5)
    assert cut.choices[0].finish_reason == "length"
    assert count_tokens(cut.choices[0].message.content) == 5


@pytest.mark.anyio
async def test_openai_async_chat_and_completions(base_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0)
    async with client:
        stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
        parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        assert "".join(parts)

        done = await client.completions.create(
            model="flowtrial-sim-code-1", prompt="func main() {\n", suffix="\n}\n", max_tokens=64
        )
        assert done.object == "text_completion" and "```" not in done.choices[0].text

        stream = await client.completions.create(
            model="m", prompt="SELECT ", stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text and chunks[-1].usage.completion_tokens == count_tokens(text)
        assert chunks[-2].choices[0].finish_reason == "stop"


def test_openai_responses_plain_stream_and_previous_id(oai: openai.OpenAI) -> None:
    first = oai.responses.create(model="flowtrial-sim-1", input="Explain Go channels")
    assert first.id.startswith("resp_") and first.status == "completed" and first.output_text
    assert first.usage.output_tokens == count_tokens(first.output_text)

    with oai.responses.stream(model="m", input="Explain Go channels") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == first.output_text

    followups = {
        oai.responses.create(model="m", input="and then?", previous_response_id=rid).output_text
        for rid in (first.id, "resp_other", "resp_third")
    }
    assert len(followups) > 1  # the previous id varies the answer
    again = oai.responses.create(model="m", input="and then?", previous_response_id=first.id)
    assert again.previous_response_id == first.id


@pytest.mark.anyio
async def test_openai_async_responses_stream_order(base_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0)
    async with client:
        stream = await client.responses.create(
            model="m", input="write sql", stream=True, max_output_tokens=4
        )
        events = [e async for e in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert sum(e.type == "response.output_text.delta" for e in events) >= 1


def test_openai_models_and_errors(oai: openai.OpenAI, base_url: str) -> None:
    assert "flowtrial-sim-1" in [m.id for m in oai.models.list()]
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="m", messages=[])
    assert err.value.status_code == 400 and err.value.body["param"] == "messages"

    bad = httpx.post(f"{base_url}/v1/chat/completions", content=b"{oops",
                     headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    missing = httpx.get(f"{base_url}/v1/nothing-here")
    assert missing.status_code == 404 and "Invalid URL" in missing.json()["error"]["message"]


def test_cycle_id_reaches_the_client(oai: openai.OpenAI) -> None:
    done = oai.chat.completions.create(
        model="m", messages=USER, extra_headers={"x-flowtrial-cycle-id": "cy42"}
    )
    assert done.id == "chatcmpl-cy42"


# ---------------------------------------------------------------------- Anthropic


def test_anthropic_create_and_stream(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(
        model="flowtrial-sim-1", max_tokens=1024, system="Be concise.", messages=USER
    )
    text = msg.content[0].text
    assert msg.id.startswith("msg_") and msg.stop_reason == "end_turn" and text
    assert msg.usage.output_tokens == count_tokens(text)
    assert msg.usage.input_tokens == count_tokens("Be concise.") + count_tokens(USER[0]["content"])

    with claude.messages.stream(
        model="flowtrial-sim-1", max_tokens=1024, system="Be concise.", messages=USER
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text == final.content[0].text
    assert final.usage.output_tokens == msg.usage.output_tokens


def test_anthropic_limits_count_and_errors(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model="m", max_tokens=3, messages=USER) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 3

    counted = claude.messages.count_tokens(model="m", messages=USER)
    assert counted.input_tokens == count_tokens(USER[0]["content"])

    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(
            model="m", max_tokens=10, messages=[{"role": "robot", "content": "x"}]
        )
    assert err.value.body["error"]["type"] == "invalid_request_error"


# ------------------------------------------------------------- Responses WebSocket


def test_websocket_mode_two_turns_and_an_invalid_message(base_url: str) -> None:
    ws_url = base_url.replace("http://", "ws://") + "/v1/responses"
    with connect(ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:

        def turn(message: dict) -> list[dict]:
            ws.send(json.dumps(message))
            events = []
            while not events or events[-1]["type"] not in (
                "response.completed", "response.incomplete", "error"
            ):
                events.append(json.loads(ws.recv(timeout=10)))
            return events

        first = turn({"type": "response.create", "model": "m", "input": "Explain Rust lifetimes"})
        assert first[0]["type"] == "response.created"
        rid = first[-1]["response"]["id"]
        text = "".join(e["delta"] for e in first if e["type"] == "response.output_text.delta")
        assert text == first[-1]["response"]["output"][0]["content"][0]["text"]

        second = turn({"type": "response.create", "model": "m", "previous_response_id": rid,
                       "input": [{"role": "user", "content": "shorter please"}]})
        assert second[-1]["type"] == "response.completed"
        assert second[-1]["response"]["previous_response_id"] == rid
        assert second[-1]["response"]["id"] != rid

        ws.send("this is not json")
        assert json.loads(ws.recv(timeout=10))["type"] == "error"
        error = turn({"type": "response.cancel"})
        assert error == [error[0]] and error[0]["error"]["type"] == "invalid_request_error"

        third = turn({"type": "response.create", "model": "m", "input": "still there?"})
        assert third[-1]["type"] == "response.completed"  # the connection stayed usable


# ------------------------------------------------------------------------- pacing


def test_native_pace_and_ttft_over_http() -> None:
    model = MockModel(tokens_per_second=200, ttft_ms=150, seed=0)
    # "C code" steers to the long C answer, so the 100-token cap is what ends it.
    messages = [{"role": "user", "content": "a ring buffer in C code"}]
    with run_asgi_server(create_mock_app(model)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        client.chat.completions.create(model="m", messages=messages, max_tokens=1)  # warm-up
        start = time.monotonic()
        stream = client.chat.completions.create(
            model="m", messages=messages, max_tokens=100, stream=True
        )
        arrivals: list[tuple[float, str]] = []
        finish = None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append((time.monotonic() - start, chunk.choices[0].delta.content))
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
    tokens = count_tokens("".join(text for _, text in arrivals))
    ttft, last = arrivals[0][0], arrivals[-1][0]
    assert finish == "length" and tokens == 100
    # The schedule can be late (a busy machine) but never early.
    assert 0.145 <= ttft < 0.30, ttft
    assert 0.64 <= last < 0.85, last  # token 99 is due at 0.15 + 99/200 = 0.645 s
    assert 160 < (tokens - 1) / (last - ttft) < 230
    assert len(arrivals) > 30  # paced in small pieces, not in one burst


# ---------------------------------------------------------------------------- CLI


def test_cli_rejects_bad_options_with_exit_2() -> None:
    app = typer.Typer()
    app.command("mock-model")(mock_model)
    runner = CliRunner()
    result = runner.invoke(app, ["--tokens-per-second", "0"])
    assert result.exit_code == 2 and "--tokens-per-second" in result.output
    for bad in ("0", "3000-2000", "many"):
        result = runner.invoke(app, ["--answer-tokens", bad])
        assert result.exit_code == 2 and "--answer-tokens" in result.output, bad
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = runner.invoke(app, ["--port", str(port)])
    assert result.exit_code == 2 and f"127.0.0.1:{port}" in result.output
