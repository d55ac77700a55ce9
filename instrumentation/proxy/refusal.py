"""A request refused with its own status: raised by a handler or an ingest job, answered in
the protocol's error shape by :class:`~.hooks.ErrorMapping` (no imports: ingest processes
raise it too)."""

from __future__ import annotations

__all__ = ["Refusal"]


class Refusal(Exception):
    """Refuse the request: ``status``, a one-line ``message`` naming the problem and the fix,
    the error ``code`` and the offending ``param``."""

    type_ = "invalid_request_error"

    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    def headers(self) -> dict[str, str]:
        """Headers the answer carries (e.g. ``Retry-After``)."""
        return {}
