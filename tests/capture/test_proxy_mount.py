"""The capture routes inside the real proxy app (create_proxy_app), without editing it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
from starlette.applications import Starlette
from starlette.routing import Mount

from flowtrial.instrumentation.continue_data import CONTINUE_PATH, continue_routes
from flowtrial.instrumentation.participant_page import COOKIE, PREFIX, participant_routes
from flowtrial.instrumentation.proxy import create_proxy_app
from tests.capture.test_continue_data import autocomplete
from tests.instrumentation.servers import run_asgi_server

MODEL = "flowtrial-sim-1"


def _completion(base: str, key: str) -> tuple[str, str, str]:
    """(cycle id, upstream response id, text) of one inline completion through the proxy."""
    c = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    raw = c.completions.with_raw_response.create(
        model=MODEL, prompt="def moving_average(values, window):\n", max_tokens=60)
    r = raw.parse()
    return raw.headers["x-flowtrial-cycle-id"], r.id, r.choices[0].text


def _wait_cycle(study: Any, cid: str) -> None:
    for _ in range(200):
        if study.rows("SELECT count(*) FROM cycles WHERE id = :c", c=cid)[0][0]:
            return
        time.sleep(0.01)
    raise AssertionError(f"cycle {cid} was not recorded")


def test_routes_inside_the_proxy_app(make_study: Any) -> None:
    study = make_study(participants=("p01",))
    app = create_proxy_app(study.database, study.config)
    # What create_proxy_app can do itself: put the capture routes in front of its own.
    app.router.routes[0:0] = [*participant_routes(study.database, study.config),
                              *continue_routes(study.database, study.config)]
    key = study.keys["p01"]
    with run_asgi_server(app) as url:
        cid, upstream_id, text = _completion(url, key)
        assert text.strip()
        _wait_cycle(study, cid)
        auth = {"Authorization": f"Bearer {key}"}
        by_text = httpx.post(url + CONTINUE_PATH, headers=auth, timeout=10,
                             json=autocomplete(True, completion=text))
        assert by_text.json()["cycle_id"] == cid and by_text.json()["link"] == "text"
        by_id = httpx.post(url + CONTINUE_PATH, headers=auth, timeout=10,
                           json=autocomplete(False, completion="", completion_id=upstream_id))
        assert by_id.json()["cycle_id"] == cid and by_id.json()["link"] == "completion_id"
        login = httpx.post(f"{url}{PREFIX}/login", data={"key": key}, timeout=10)
        assert login.status_code == 303 and COOKIE in login.cookies
        assert httpx.get(f"{url}/flowtrial/v1/health", timeout=10).json()["status"] == "ok"
    kinds = study.rows("SELECT kind, cycle_id, source FROM events ORDER BY id")
    assert kinds == [("accept", cid, "continue"), ("reject", cid, "continue")]


def test_proxy_app_mounted_under_a_wrapper(make_study: Any) -> None:
    study = make_study(participants=("p01",))
    proxy = create_proxy_app(study.database, study.config)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # A mounted app's lifespan does not run by itself: run the proxy's from here.
        async with proxy.router.lifespan_context(proxy):
            yield

    outer = Starlette(routes=[*participant_routes(study.database, study.config),
                              *continue_routes(study.database, study.config),
                              Mount("/", app=proxy)], lifespan=lifespan)
    key = study.keys["p01"]
    with run_asgi_server(outer) as url:
        cid, _, text = _completion(url, key)
        _wait_cycle(study, cid)
        r = httpx.post(url + CONTINUE_PATH, headers={"Authorization": f"Bearer {key}"},
                       json=autocomplete(True, completion=text), timeout=10)
        assert r.json()["cycle_id"] == cid
        assert httpx.get(f"{url}{PREFIX}/login", timeout=10).status_code == 200
