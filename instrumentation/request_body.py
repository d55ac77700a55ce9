"""Reading a request body under a size limit (the proxy's endpoints and the Continue one);
``unstorable_value`` is :mod:`flowtrial.study.validation`'s, shared with the importers."""

from __future__ import annotations

from starlette.requests import Request

from flowtrial.study.validation import unstorable_value

__all__ = ["BodyTooLarge", "read_body", "unstorable_value"]

class BodyTooLarge(Exception):
    """The body is over the limit (the caller answers 413 and writes nothing)."""


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refusing more than ``limit`` bytes: by its declared length before reading any,
    else as soon as more has arrived (so an oversized body is never held in memory whole)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)
