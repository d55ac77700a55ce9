"""``previous_response_id`` continues only the participant's own responses (issue #28):
another participant's id is refused in the protocol's shape, over HTTP and the WebSocket
mode, whether this proxy remembers the response or only the database does (a restart)."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from websockets.sync.client import connect

from flowtrial.instrumentation.proxy import serve_proxy

from .conftest import make_study


def test_only_own_responses_continue(tmp_path: Path) -> None:
    study = make_study(tmp_path)
    with serve_proxy(study.db, study.config) as proxy:
        alice = openai.OpenAI(base_url=proxy.base_url + "/v1", api_key=study.keys["p01"])
        bob = openai.OpenAI(base_url=proxy.base_url + "/v1", api_key=study.keys["p02"])
        first = alice.responses.create(model="m", input="hello")
        assert first.id
        again = alice.responses.create(model="m", input="more", previous_response_id=first.id)
        assert again.id  # her own: honoured
        with pytest.raises(openai.NotFoundError) as caught:
            bob.responses.create(model="m", input="mine now", previous_response_id=first.id)
        assert caught.value.code == "previous_response_not_found"
        assert caught.value.param == "previous_response_id"
        ws = proxy.base_url.replace("http://", "ws://") + "/v1/responses"
        with connect(ws, additional_headers={"authorization": f"Bearer {study.keys['p02']}"}
                     ) as sock:
            sock.send(json.dumps({"type": "response.create", "model": "m", "input": "x",
                                  "previous_response_id": first.id}))
            err = json.loads(sock.recv(timeout=10))
            assert err["type"] == "error"
            assert "previous_response_not_found" in json.dumps(err)
    bob_cycles = study.rows("SELECT COUNT(*) FROM cycles WHERE participant_id = 'p02'")[0][0]
    assert bob_cycles == 0  # refused before any cycle: nothing forwarded, nothing recorded
    # A fresh proxy (nothing in memory) finds the owner in the database.
    with serve_proxy(study.db, study.config) as proxy:
        bob = openai.OpenAI(base_url=proxy.base_url + "/v1", api_key=study.keys["p02"])
        with pytest.raises(openai.NotFoundError):
            bob.responses.create(model="m", input="mine now", previous_response_id=first.id)
        alice = openai.OpenAI(base_url=proxy.base_url + "/v1", api_key=study.keys["p01"])
        assert alice.responses.create(model="m", input="on", previous_response_id=first.id).id


def test_conversation_key_is_keyed_and_secret_stays_home(tmp_path: Path) -> None:
    """``conversation_key`` is an HMAC with the study's secret: the plain hash of a guessed
    prompt matches no row, and the secret is not in an export."""
    from flowtrial.instrumentation.turns.classify import features
    from flowtrial.study.export import export_tables
    from flowtrial.study.keys import CONVERSATION_SECRET, conversation_secret

    study = make_study(tmp_path)
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "guess me"}]
    with serve_proxy(study.db, study.config) as proxy:
        alice = openai.OpenAI(base_url=proxy.base_url + "/v1", api_key=study.keys["p01"])
        alice.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    (stored,) = study.rows("SELECT conversation_key FROM cycles")[0]
    body = {"messages": messages}
    assert stored and stored != features("chat", body).conversation_key
    secret = conversation_secret(study.database.engine)
    assert stored == features("chat", body, secret).conversation_key
    assert features("chat", body, b"another study").conversation_key != stored
    out = tmp_path / "export"
    export_tables(study.database, out, "csv")
    assert CONVERSATION_SECRET not in (out / "meta.csv").read_text()
    assert secret.hex() not in "".join(p.read_text() for p in out.glob("*.csv"))
