"""Turn rules for agents nobody tuned them to (docs/concepts/turns.md): the client's agent
name, a title call revised once the main request follows, the typing-speed rule, a failed
call ending its turn, and the harmless tool the simulated model picks from any schema.

Requests go through the proxy with the official OpenAI SDK; the proxy's turn rows are
compared with those `rebuild_turns` makes from the cycles (also with the revisions undone
first, as cycles recorded by another process would be).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from typer.testing import CliRunner

from flowtrial.cli import app
from flowtrial.instrumentation.mock_model.harmless import pick_harmless
from flowtrial.instrumentation.proxy import create_proxy_app
from flowtrial.instrumentation.turns.clients import client_identity
from flowtrial.study.turns import rebuild_turns
from flowtrial.study.typing_window import typing_gaps, window_sensitivity
from tests.instrumentation.conftest import StudySetup
from tests.instrumentation.servers import run_asgi_server

pytestmark = pytest.mark.both_backends

MODEL = "flowtrial-sim-1"
WINDOW_S = 0.4  # the study's typing window (short, so the test need not wait 1 s)
IDLE_S = 1.0  # the study's idle limit (short, so the test need not wait 600 s)
_LS = {"type": "function", "function": {
    "name": "list_dir", "description": "List a directory",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}
_TURNS = ("id, client, model_calls, side_calls, tool_calls, status, first_cycle_id, "
          "last_cycle_id, wait_ms, model_ms, tool_ms, gap_ms")


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, default_headers={
        "User-Agent": "opencode/1.18.33 ai-sdk/provider-utils/4.0.23"})


@pytest.fixture
def served(make_study: Any) -> Iterator[tuple[StudySetup, openai.OpenAI]]:
    s = make_study(participants=("p01", "p02"), overrides={
        "study": {"typing_window_s": WINDOW_S, "idle_limit_s": IDLE_S},
        "upstream": {"tool_steps": 1, "mock": {"tokens_per_second": 20000, "ttft_ms": 1}},
        "arms": [{"name": "shaped", "ttft_ms": 20, "tokens_per_second": 4000}]})
    with run_asgi_server(create_proxy_app(s.database, s.config)) as url:
        yield s, _client(url, s.key)


def _cycles(s: StudySetup) -> list[Any]:
    return s.rows("SELECT id, request_kind, kind_rule, revised_from, turn_id, client, "
                  "client_sdk FROM cycles ORDER BY t_request_ns")


def _turns(s: StudySetup, calls: int) -> list[Any]:
    deadline = time.monotonic() + 10
    while True:
        rows = s.rows(f"SELECT {_TURNS} FROM turns ORDER BY t_start_ns")
        if sum(r.model_calls + r.side_calls for r in rows) >= calls or (
                time.monotonic() > deadline):
            return [tuple(r) for r in rows]
        time.sleep(0.05)


def _rebuilt(s: StudySetup) -> list[tuple[Any, ...]]:
    rebuild_turns(s.database)
    return [tuple(r) for r in s.rows(f"SELECT {_TURNS} FROM turns ORDER BY t_start_ns")]


def _title(client: openai.OpenAI, text: str, stream: bool = False) -> Any:
    return client.chat.completions.create(model=MODEL, stream=stream, max_tokens=32, messages=[
        {"role": "system", "content": "You are a title generator. Output only a title."},
        {"role": "user", "content": "Generate a title for this conversation:\n"},
        {"role": "user", "content": text}])


def _agent_turn(client: openai.OpenAI, text: str) -> None:
    """The agent's turn: a request offering a tool, the tool's result, the answer."""
    messages: list[Any] = [{"role": "system", "content": "You are an agent."},
                           {"role": "user", "content": text}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[_LS])
    call = first.choices[0].message.tool_calls[0]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "a.py"}]
    client.chat.completions.create(model=MODEL, messages=messages, tools=[_LS])


def test_title_call_before_the_main_request_is_revised_to_side(served: Any) -> None:
    """Each participant's very first request is a title call, and so is the first after the
    idle limit. The first participant's are recorded before the main request comes, which
    revises their rows and deletes their turns'; the second's is still streaming when its
    main request comes, and is revised in memory before its row is written."""
    s, client = served
    _title(client, "Which folder is this?")
    _agent_turn(client, "Which folder is this?")
    time.sleep(IDLE_S * 1.5)
    _title(client, "Which files are here?")
    _agent_turn(client, "Which files are here?")
    client = _client(str(client.base_url).removesuffix("/v1/"), s.keys["p02"])
    stream = _title(client, "And what is in it?", stream=True)
    next(iter(stream))  # the title's answer has begun, its cycle is not recorded yet
    _agent_turn(client, "And what is in it?")
    for _ in stream:
        pass
    rows = _cycles(s)
    revised = ("side", "revised:same_input_before_main", "human:new_input")
    assert [(r.request_kind, r.kind_rule, r.revised_from) for r in rows] == [
        revised, ("human", "new_input", None),
        ("continuation", "tool_output:chat:tool_message", None)] * 3, rows
    assert [r.turn_id for r in rows[0::3]] == [r.turn_id for r in rows[1::3]]
    assert {(r.client, r.client_sdk) for r in rows} == {("opencode", "ai-sdk")}
    turns = _turns(s, len(rows))
    assert [(t[2], t[3], t[5]) for t in turns] == [(2, 1, "complete")] * 3, turns
    assert _rebuilt(s) == turns
    # Undone (as another process's cycles would hold them), the rebuild revises them again.
    with s.database.engine.begin() as conn:
        from sqlalchemy import text

        conn.execute(text("UPDATE cycles SET request_kind = 'human', kind_rule = 'new_input', "
                          "revised_from = NULL, turn_id = 'trn_' || substr(id, 5) "
                          "WHERE revised_from IS NOT NULL"))
    assert _rebuilt(s) == turns
    assert [(r.request_kind, r.kind_rule, r.revised_from) for r in _cycles(s)][0] == revised


def test_faster_than_typing_continues_the_turn_and_a_failure_ends_it(served: Any) -> None:
    """aider re-asks at once when an answer breaks its edit format: the same conversation,
    a user message sooner than a person can type, so the same turn. A person's next prompt
    (after the window) is a new turn; so is new input after a failed call."""
    s, client = served
    convo: list[Any] = [{"role": "system", "content": "Act as an expert developer."},
                        {"role": "user", "content": "Say hello."}]
    answer = client.chat.completions.create(model=MODEL, messages=convo)
    convo += [{"role": "assistant", "content": answer.choices[0].message.content},
              {"role": "user", "content": "No filename provided before ``` in file listing"}]
    answer = client.chat.completions.create(model=MODEL, messages=convo)
    time.sleep(WINDOW_S * 1.5)
    convo += [{"role": "assistant", "content": answer.choices[0].message.content},
              {"role": "user", "content": "Thanks. Now say goodbye."}]
    client.chat.completions.create(model=MODEL, messages=convo)
    rows = _cycles(s)
    assert [(r.request_kind, r.kind_rule) for r in rows] == [
        ("human", "new_input"), ("continuation", "faster_than_typing"),
        ("human", "new_input")], rows
    turns = _turns(s, 3)
    assert [(t[2], t[5]) for t in turns] == [(2, "complete"), (1, "complete")]
    assert _rebuilt(s) == turns
    # How the turns hang on the window: the re-ask came within it, the person's prompt after.
    gaps = typing_gaps(s.database)
    assert len(gaps) == 2 and gaps[0] < WINDOW_S < WINDOW_S * 1.5 <= gaps[1], gaps
    assert window_sensitivity(gaps, (gaps[0] / 2, WINDOW_S, 60.0)) == [
        (gaps[0] / 2, 0), (WINDOW_S, 1), (60.0, 2)]
    out = CliRunner().invoke(app, ["turns", "--db", str(s.db)])
    assert out.exit_code == 0, out.output
    assert "Typing-speed rule: 2 user messages" in " ".join(out.output.split()), out.output


def test_a_sign_that_the_person_acted_lifts_the_typing_speed_rule(served: Any) -> None:
    s, client = served
    convo: list[Any] = [{"role": "user", "content": "Say hello."}]
    answer = client.chat.completions.create(model=MODEL, messages=convo)
    base = str(client.base_url).removesuffix("/v1/")
    r = httpx.post(f"{base}/flowtrial/v1/events", headers={"authorization": f"Bearer {s.key}"},
                   json={"events": [{"kind": "edit"}]})
    assert r.status_code in (200, 202), r.text
    convo += [{"role": "assistant", "content": answer.choices[0].message.content},
              {"role": "user", "content": "y"}]
    client.chat.completions.create(model=MODEL, messages=convo)
    assert [(r.request_kind, r.kind_rule) for r in _cycles(s)] == [
        ("human", "new_input"), ("human", "new_input")]


@pytest.mark.parametrize(("ua", "agent", "sdk"), [
    ("claude-cli/2.1.197 (external, sdk-cli)", "claude-cli", None),
    ("GeminiCLI-tui/0.61.0/flowtrial-sim-1 (linux; x64)", "gemini-cli", None),
    ("codex_exec/0.169.0 (Debian 12.0.0; x86_64) dumb", "codex", None),
    ("codex_cli_rs/0.170.1 (Mac OS 15.5.0; arm64) iTerm.app/3.5.14", "codex", None),
    ("GeminiCLI/0.9.0 (linux; x64) google-api-nodejs-client/9.15.1", "gemini-cli",
     "google-api-nodejs"),
    ("opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14", "opencode", "ai-sdk"),
    ("ai-sdk/openai-compatible/3.0.37", "ai-sdk", "ai-sdk"),
    ("ai-sdk/openai-compatible/3.1.0", "ai-sdk", "ai-sdk"),  # an update: the same client
    ("aider/0.86.2 OpenAI/Python 2.20.0", "aider", "openai/python"),
    ("OpenAI/Python 2.20.0", "openai/python", "openai/python"),
    ("AsyncOpenAI/Python 1.99.0", "openai/python", "openai/python"),
    ("OpenAI/JS 4.104.0", "openai/js", "openai/js"),
    ("Anthropic/Python 0.60.0", "anthropic/python", "anthropic/python"),
    ("Anthropic/JS 0.54.0", "anthropic/js", "anthropic/js"),
    ("QwenCode/0.0.14 (linux; x64)", "qwen-code", None),
    ("my-chat/1.0", "my-chat", None),
    ("", None, None), (None, None, None),
])
def test_client_identity_is_the_agent_without_version(ua: str | None, agent: str | None,
                                                     sdk: str | None) -> None:
    assert client_identity(ua) == (agent, sdk) or (
        (client_identity(ua).agent, client_identity(ua).sdk) == (agent, sdk))


def test_client_identity_reads_the_app_title_of_an_sdk_client() -> None:
    """Cline and its forks use the OpenAI JS SDK and name themselves in X-Title."""
    who = client_identity("OpenAI/JS 4.104.0", {"x-title": "Roo Code"})
    assert (who.agent, who.sdk) == ("roo-code", "openai/js")


def _fn(name: str, properties: dict[str, Any], required: list[str],
        description: str = "") -> tuple[str, str, dict[str, Any]]:
    return name, description, {"type": "object", "properties": properties,
                               "required": required}


def test_harmless_tool_picked_from_any_schema() -> None:
    opencode = [_fn("edit", {"filePath": {"type": "string"}}, ["filePath"]),
                _fn("glob", {"pattern": {"type": "string"}}, ["pattern"]),
                _fn("bash", {"command": {"type": "string"}, "description": {"type": "string"},
                             "timeout": {"type": "number"}}, ["command", "description"]),
                _fn("read", {"filePath": {"type": "string"}}, ["filePath"]),
                _fn("webfetch", {"url": {"type": "string"}}, ["url"])]
    assert pick_harmless(opencode) == ("bash", {
        "command": "pwd", "description": "Print the working directory"})
    # Other names: an array of commands, an array of files, required numbers and enums.
    assert pick_harmless([_fn("run_commands", {"commands": {
        "type": "array", "items": {"type": "string"}}}, ["commands"])]) == (
        "run_commands", {"commands": ["pwd"]})
    assert pick_harmless([_fn("read_files", {
        "paths": {"type": "array", "items": {"type": "string"}},
        "max_lines": {"type": "integer", "minimum": 10},
        "mode": {"type": "string", "enum": ["text", "hex"]}},
        ["paths", "max_lines", "mode"])]) == (
        "read_files", {"paths": ["."], "max_lines": 10, "mode": "text"})
    # A listing tool first; one known only by its description; unfillable ones passed over.
    assert pick_harmless([opencode[2], _fn("list_directory", {"dir_path": {"type": "string"}},
                                           ["dir_path"])])[0] == "list_directory"
    assert pick_harmless([_fn("fs_tool", {"path": {"type": "string"}}, ["path"],
                              "Lists the files of a directory")]) == ("fs_tool", {"path": "."})
    assert pick_harmless([_fn("search_code", {"q": {"type": "object", "properties": {}},
                                              "blob": {}}, ["blob"])]) is not None
    # A glob gets `*`, a text search a plain word.
    assert pick_harmless([opencode[1]]) == ("glob", {"pattern": "*"})
    assert pick_harmless([_fn("Grep", {"pattern": {"type": "string"}, "path": {
        "type": "string"}}, ["pattern"])]) == ("Grep", {"pattern": "TODO", "path": "."})
    # Nothing harmless: text.
    assert pick_harmless([opencode[0], opencode[4], _fn("write_file", {}, []),
                          _fn("delete", {"path": {"type": "string"}}, ["path"])]) is None
    assert pick_harmless([_fn("bash", {"script_id": {"type": "string"}}, ["script_id"])]) is None


def test_tool_steps_drive_an_agent_with_other_tool_names(served: Any) -> None:
    s, client = served
    tools = [{"type": "function", "function": {
        "name": "run_commands", "description": "Run shell commands",
        "parameters": {"type": "object", "properties": {
            "commands": {"type": "array", "items": {"type": "string"}}},
            "required": ["commands"]}}}]
    r = client.chat.completions.create(model=MODEL, tools=tools, messages=[
        {"role": "user", "content": "Where are we?"}])
    call = r.choices[0].message.tool_calls[0].function
    assert (call.name, json.loads(call.arguments)) == ("run_commands", {"commands": ["pwd"]})


def test_a_cut_stream_ends_its_turn_and_new_questions_open_their_own(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real upstream cuts the stream mid-answer; the person's next two questions (new
    conversations) are new turns, not side calls of the errored turn."""
    from tests.instrumentation.conftest import build_study
    from tests.reliability.faulty_upstream import faulty_upstream

    monkeypatch.setenv("FT_TURNS_UPSTREAM_KEY", "sk-turns-upstream-key")
    with faulty_upstream() as up:
        s = build_study(tmp_path, {"upstream": {
            "kind": "openai", "timeout_s": 2,
            "openai": {"base_url": up.base_url + "/v1", "api_key_env": "FT_TURNS_UPSTREAM_KEY"}}})
        try:
            with run_asgi_server(create_proxy_app(s.database, s.config)) as url:
                client = openai.OpenAI(base_url=url + "/v1", api_key=s.key, max_retries=0)
                with pytest.raises(openai.APIError):
                    for _ in client.chat.completions.create(
                            model=MODEL, stream=True, extra_headers={"x-fault": "die:3"},
                            messages=[{"role": "user", "content": "Explain the stack."}]):
                        pass
                for question in ("What is a queue?", "And a deque?"):
                    client.chat.completions.create(model=MODEL, messages=[
                        {"role": "user", "content": question}])
                rows = s.rows("SELECT request_kind, kind_rule, turn_id, status FROM cycles "
                              "ORDER BY t_request_ns")
                assert [(r.request_kind, r.kind_rule) for r in rows] == [
                    ("human", "new_input")] * 3, rows
                assert rows[0].status != "ok" and len({r.turn_id for r in rows}) == 3
                turns = _turns(s, 3)
                assert sorted(t[5] for t in turns) == ["complete", "complete", "error"]
                assert _rebuilt(s) == turns
        finally:
            s.database.dispose()
