"""Caps on what an upload may store (event API, Continue, OTLP): inflated size, string value
size, payload size and time range. Settings in ``[proxy]`` (docs/operators/limits.md); the
functions here are pure and run in the ingest processes
(:mod:`flowtrial.instrumentation.proxy.ingest`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flowtrial.study.config import ProxySection

__all__ = [
    "MAX_TIME_NS", "MIN_TIME_NS", "TRUNCATED_KEY", "InflateError", "UploadCaps", "cap_payload",
    "inflate", "time_out_of_range",
]

#: Times an upload may carry (UTC epoch ns): 2000-01-01 to 2100-01-01.
MIN_TIME_NS = int(datetime(2000, 1, 1, tzinfo=UTC).timestamp()) * 1_000_000_000
MAX_TIME_NS = int(datetime(2100, 1, 1, tzinfo=UTC).timestamp()) * 1_000_000_000
#: The key a capped payload carries: the paths of what was cut or left out.
TRUNCATED_KEY = "_truncated"
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class UploadCaps:
    """The ``[proxy]`` caps an upload meets once it has been read."""

    max_inflated_bytes: int = 32 * 1024 * 1024
    max_records_per_post: int = 2000
    max_value_bytes: int = 4096
    max_payload_bytes: int = 64 * 1024

    @classmethod
    def from_config(cls, proxy: ProxySection) -> UploadCaps:
        return cls(proxy.max_inflated_bytes, proxy.max_records_per_post,
                   proxy.max_value_bytes, proxy.max_payload_bytes)


class InflateError(ValueError):
    """A compressed body that is not valid, truncated or inflates beyond the cap;
    ``too_large`` tells the last apart (413 rather than 400)."""

    def __init__(self, message: str, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large

    def __reduce__(self) -> Any:  # crosses the ingest process boundary
        return (InflateError, (str(self), self.too_large))


def inflate(body: bytes, encoding: str | None, cap: int) -> bytes:
    """``body`` decoded per its Content-Encoding (gzip, deflate or none), inflated in
    chunks against ``cap`` bytes: a bomb stops at the cap, having held no more than it."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        return body
    if enc not in ("gzip", "x-gzip", "deflate"):
        raise InflateError(f"unsupported Content-Encoding {encoding!r}: send gzip or none")
    wbits = 16 + zlib.MAX_WBITS if enc != "deflate" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    out = bytearray()
    data = body
    try:
        while True:
            out += inflater.decompress(data, _CHUNK)
            if len(out) > cap:
                raise InflateError(f"the body inflates to more than {cap} bytes "
                                   "(proxy.max_inflated_bytes): send smaller batches", True)
            data = inflater.unconsumed_tail
            if not data:
                break
        out += inflater.flush()
    except zlib.error as exc:
        raise InflateError(f"the body is not valid {enc}: {exc}") from None
    if len(out) > cap:
        raise InflateError(f"the body inflates to more than {cap} bytes "
                           "(proxy.max_inflated_bytes): send smaller batches", True)
    if not inflater.eof:  # a cut-off stream would decode into a partial request
        raise InflateError(f"the {enc} body is truncated")
    return bytes(out)


def time_out_of_range(ns: int) -> bool:
    """Whether a (non-zero) UTC epoch-ns time lies outside 2000–2100."""
    return ns != 0 and not MIN_TIME_NS <= ns <= MAX_TIME_NS


def _utf8_len(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


def _cut(s: str, limit: int) -> str:
    """``s`` cut to at most ``limit`` UTF-8 bytes (on a character boundary)."""
    return s.encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "ignore")


class _Capper:
    def __init__(self, max_value: int, budget: int) -> None:
        self.max_value = max_value
        self.budget = budget
        self.cut: list[str] = []

    def walk(self, v: Any, path: str) -> Any:
        if isinstance(v, str):
            n = _utf8_len(v)
            if n > self.max_value:
                self.cut.append(f"{path} ({n} bytes)")
                v = _cut(v, self.max_value)
                n = self.max_value
            self.budget -= n + 2
            return v
        if isinstance(v, dict):
            out: dict[str, Any] = {}
            for i, (k, x) in enumerate(v.items()):
                if self.budget <= 0:
                    self.cut.append(f"{path or 'payload'}: {len(v) - i} more field(s)")
                    break
                key = k if len(k) <= 256 else _cut(k, 256)
                self.budget -= len(key) + 3
                out[key] = self.walk(x, f"{path}.{key}" if path else key)
            return out
        if isinstance(v, list | tuple):
            items: list[Any] = []
            for i, x in enumerate(v):
                if self.budget <= 0:
                    self.cut.append(f"{path}: {len(v) - i} more item(s)")
                    break
                items.append(self.walk(x, f"{path}[{i}]"))
            return items
        self.budget -= 8
        return v


def cap_payload(payload: dict[str, Any], caps: UploadCaps) -> dict[str, Any]:
    """``payload`` with strings longer than ``max_value_bytes`` cut and, once
    ``max_payload_bytes`` is spent, the remaining fields and items left out; what was cut is
    listed under :data:`TRUNCATED_KEY` (at most 20 entries)."""
    capper = _Capper(caps.max_value_bytes, caps.max_payload_bytes)
    out = capper.walk(payload, "")
    if capper.cut:
        out[TRUNCATED_KEY] = capper.cut[:20]
    return out
