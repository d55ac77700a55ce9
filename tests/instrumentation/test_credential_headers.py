"""A family's credential headers are declared in its protocol module only: authentication,
the upstream request and redaction all take them from there (issue 29)."""

from __future__ import annotations

from flowtrial.instrumentation.proxy import auth, upstream
from flowtrial.instrumentation.proxy.protocols import (
    CREDENTIAL_HEADERS,
    FAMILIES,
    PLAIN_KEY_HEADERS,
)
from flowtrial.instrumentation.proxy.upstream import forwardable_request_headers


def test_every_family_credential_is_known_everywhere() -> None:
    for family in FAMILIES.values():
        for header in family.credential_headers:
            assert header in CREDENTIAL_HEADERS
            assert header in upstream._REQUEST_DROP, header
    assert auth.CREDENTIAL_HEADERS is CREDENTIAL_HEADERS
    assert {"authorization", "x-api-key", "x-goog-api-key", "api-key"} <= set(CREDENTIAL_HEADERS)


def test_plain_key_headers_identify_and_are_redacted() -> None:
    for header in PLAIN_KEY_HEADERS:
        headers = {header: "  ft_secret  "}
        assert auth.key_from_headers(headers) == "ft_secret"
        assert "ft_secret" in auth.client_secrets(headers)
    assert auth.key_from_headers({"authorization": "Bearer ft_b"}) == "ft_b"


def test_no_credential_header_is_forwarded_to_a_study_key_upstream() -> None:
    sent = {h: "secret" for h in CREDENTIAL_HEADERS} | {"x-custom": "kept"}
    forwarded = forwardable_request_headers(sent)
    assert not set(forwarded) & set(CREDENTIAL_HEADERS)
    assert forwarded.get("x-custom") == "kept"
