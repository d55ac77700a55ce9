"""docs/operators/limits.md lists every ``[proxy]`` cap with its setting and its default as
the code has it (issue #28): a cap added or changed in the code without the page fails here."""

from __future__ import annotations

import re
from pathlib import Path

from flowtrial.study.config import ProxySection

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operators" / "limits.md"
#: ``[proxy]`` settings that are not limits (where to listen, features, names), each with why.
NOT_CAPS = {
    "host": "where the proxy listens",
    "port": "where the proxy listens",
    "public_url": "the address participants are told",
    "quiet_gc": "a runtime tuning switch",
    "admin_token_env": "the name of an environment variable",
    "otlp_grpc_port": "where the OTLP/gRPC receiver listens (its uploads meet the upload caps)",
}


def _rows() -> dict[str, str]:
    text = PAGE.read_text(encoding="utf-8")
    return {m.group(1): m.group(2).strip()
            for m in re.finditer(r"^\| `([a-z0-9_]+)` \| ([^|]*) \|", text, re.M)}


def test_every_proxy_cap_is_on_the_limits_page_with_its_default() -> None:
    rows = _rows()
    fields = ProxySection.model_fields
    assert set(NOT_CAPS) <= set(fields), set(NOT_CAPS) - set(fields)
    for name, field in fields.items():
        if name in NOT_CAPS:
            continue
        assert name in rows, f"proxy.{name} is not listed in {PAGE.name}"
        shown = re.match(r"[\d.]+", rows[name])
        assert shown is not None, f"proxy.{name}: no default in {rows[name]!r}"
        assert float(shown.group()) == float(field.default), (name, rows[name], field.default)
    assert not set(rows) - set(fields), f"listed but not settings: {set(rows) - set(fields)}"
