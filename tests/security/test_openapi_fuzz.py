"""Schemathesis against the proxy's own OpenAPI document (``/flowtrial/v1/openapi.json``),
in-process over ASGI: events, Continue, health, admin — schema-valid and schema-breaking
requests, with the participant's key or the admin token.

Schemathesis checks no 5xx, documented status codes, content types and response schemas,
that schema-breaking data is refused, that the endpoints refuse requests without their
credentials, and that unsupported methods get 405. On top, every case checks the database:
a refused request wrote nothing; an accepted event batch wrote exactly what it reported.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import positive_data_acceptance

from flowtrial.instrumentation.proxy.app import create_proxy_app
from flowtrial.instrumentation.proxy.openapi import OPENAPI_PATH
from tests.security.conftest import Study, bearer, make_study

ADMIN_ENV = "FT_SCHEMA_ADMIN_TOKEN"
ADMIN_TOKEN = "schemathesis-admin-" + "k" * 24


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Study]:
    s = make_study(tmp_path_factory.mktemp("schema"), {"proxy": {"max_body_bytes": 64 * 1024,
                                                                 "admin_token_env": ADMIN_ENV}},
                   participants=("alice", "bob"))
    old = os.environ.get(ADMIN_ENV)
    os.environ[ADMIN_ENV] = ADMIN_TOKEN
    yield s
    if old is None:
        os.environ.pop(ADMIN_ENV, None)
    else:
        os.environ[ADMIN_ENV] = old
    s.database.dispose()


@pytest.fixture(scope="module")
def api_schema(study: Study) -> Any:
    # Schemathesis runs the app's lifespan (writer, upstream) itself and keeps it for a test.
    app = create_proxy_app(study.database, study.config)
    # 413 (over proxy.max_body_bytes) is a refusal too: schemathesis's default list lacks it.
    refused = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]
    config = SchemathesisConfig.from_dict({"checks": {"negative_data_rejection": {
        "expected-statuses": refused}}})
    return schemathesis.openapi.from_asgi(OPENAPI_PATH, app, config=config)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
def test_own_api_conforms_and_writes_nothing_it_refuses(case: Any, study: Study) -> None:
    admin = case.path.startswith("/flowtrial/v1/admin/")
    headers = bearer(ADMIN_TOKEN if admin else study.keys["alice"])
    before = study.counts()
    response = case.call(headers=headers)
    # Valid-shaped events may still be refused by design (422): a cycle_id that is not the
    # participant's, a partial_accept without its size, a time outside 2000-2100.
    case.validate_response(response, headers=headers,
                           excluded_checks=[positive_data_acceptance])
    after = study.counts()
    written = after["events"] - before["events"]
    if response.status_code == 200 and case.path == "/flowtrial/v1/events":
        assert written == response.json()["accepted"]
    elif response.status_code == 200 and case.path == "/flowtrial/v1/continue":
        # A re-sent Continue payload adds nothing and says so (accepted 0, duplicates 1).
        assert written == response.json()["accepted"]
        assert {k: v for k, v in after.items() if k != "events"} == {
            k: v for k, v in before.items() if k != "events"}
    else:
        assert after == before, f"{case.method} {case.path} -> {response.status_code} wrote"
    assert after["cycles"] == before["cycles"]
    assert study.rows("SELECT COUNT(*) FROM events WHERE participant_id != 'alice'"
                      )[0][0] == 0
