"""The participant page's field-study parts (docs/researchers/field-study.md): consent,
"connect your assistant", activity upload and withdrawal.

Consent: with a ``[consent]`` text in the study file, login shows it first and nothing else
of the page works until the participant agrees; agreeing records the time and the text's
version. Connect: the page shows each client's settings from :mod:`..client_recipes`; with
the key filled in right after a login that asked for it (after consent, if needed) or when the
key is pasted on the connect page (it is never stored; otherwise a placeholder).
Activity: an ActivityWatch export file (standard or Research Edition) uploaded in a plain
form goes through the proxy's ingest path (:func:`..activity_upload.ingest_upload`: parsed
in an ingest process, bounded; when full the page says "busy, try again"); the form itself is
split in a worker thread. Withdraw: stops recording at once; with "delete my
data" every row of theirs is deleted (:mod:`flowtrial.study.participation`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from flowtrial.study.config import StudyConfig
from flowtrial.study.errors import FlowtrialError
from flowtrial.study.participants import participant_by_key
from flowtrial.study.participation import (
    Standing,
    give_consent,
    standing_of,
    withdraw,
)
from flowtrial.study.storage import Database

from ..activity_upload import activity_summary, ingest_upload
from ..client_recipes import DOC_KEY, RECIPES, render
from ..proxy.ingest import IngestBusy
from ..request_body import BodyTooLarge, read_body
from .session import Session, SessionSigner

__all__ = ["PageKit", "connect_context", "field_routes", "needs_consent"]


@dataclass
class PageKit:
    """What the field routes share with the page's main routes."""

    database: Database
    config: StudyConfig
    prefix: str
    signer: SessionSigner
    render: Callable[..., Response]
    redirect: Callable[..., Response]
    forbidden: Callable[[], Response]
    session_of: Callable[[Request], Awaitable[Session | None]]
    authed_form: Callable[[Request], Awaitable[Any]]
    max_upload_bytes: int = 10 * 1024 * 1024


def needs_consent(database: Database, config: StudyConfig, pid: str) -> bool:
    return standing_of(database, config, pid).code == "consent_required"


def connect_context(config: StudyConfig, key: str | None) -> list[dict[str, Any]]:
    """Each client's settings, with ``key`` (or the docs' placeholder) filled in."""
    base = config.proxy.base_url
    return [{"name": r.name, "title": r.title,
             "snippets": render(r, key=key or DOC_KEY, base_url=base)}
            for r in RECIPES.values()]


def _tell_proxy(request: Request, pid: str, now: Standing) -> None:
    """Mounted in the proxy: its authenticator takes the change at once."""
    st = getattr(request.app.state, "proxy", None)
    if st is not None:
        st.auth.note(pid, now)


def _multipart(ctype: str, body: bytes) -> dict[str, bytes]:
    """The fields of a multipart/form-data body (runs in the worker thread)."""
    msg = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + ctype.encode("latin-1") + b"\r\n\r\n" + body)
    out: dict[str, bytes] = {}
    if not msg.is_multipart():
        return out
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes) and name not in out:
            out[name] = payload
    return out


def field_routes(kit: PageKit) -> list[BaseRoute]:
    """Consent, connect, activity upload and withdrawal under the page's prefix."""
    p = kit.prefix

    def page(request: Request, sess: Session, name: str, status: int = 200,
             **ctx: Any) -> Response:
        return kit.render(name, status, csrf=kit.signer.csrf(sess),
                          participant=sess.participant_id, **ctx)

    def consent_page(request: Request, sess: Session, key: str | None = None,
                     error: str | None = None) -> Response:
        assert kit.config.consent is not None
        return page(request, sess, "consent.html", 409 if error else 200,
                    consent=kit.config.consent, key=key, error=error)

    async def consent(request: Request) -> Response:
        if request.method == "GET":
            sess = await kit.session_of(request)
            if sess is None:
                return kit.redirect(f"{p}/login")
            if kit.config.consent is None:
                return kit.redirect(f"{p}/")
            return consent_page(request, sess)
        got = await kit.authed_form(request)
        if isinstance(got, Response):
            return got
        sess, form = got
        key = form.get("key") or None
        try:
            await asyncio.to_thread(give_consent, kit.database, kit.config,
                                    sess.participant_id, form.get("version", ""))
        except FlowtrialError as exc:
            return consent_page(request, sess, key, str(exc))
        _tell_proxy(request, sess.participant_id, Standing(True))
        if key is not None:
            found = await asyncio.to_thread(participant_by_key, kit.database, key)
            if found is not None and found.id == sess.participant_id:
                return page(request, sess, "connect.html", clients=connect_context(
                    kit.config, key), with_key=True, message="Thank you: your consent is "
                    "recorded. Now connect your assistant.")
        return kit.redirect(f"{p}/connect", "consented")

    async def connect(request: Request) -> Response:
        if request.method == "GET":
            sess = await kit.session_of(request)
            if sess is None:
                return kit.redirect(f"{p}/login")
            return page(request, sess, "connect.html",
                        clients=connect_context(kit.config, None), with_key=False)
        got = await kit.authed_form(request)  # the key pasted again: settings filled in
        if isinstance(got, Response):
            return got
        sess, form = got
        key = form.get("key", "").strip()
        found = await asyncio.to_thread(participant_by_key, kit.database, key) if key else None
        if found is None or found.id != sess.participant_id:
            return page(request, sess, "connect.html", 401, with_key=False,
                        clients=connect_context(kit.config, None),
                        error="That is not your participant key.")
        return page(request, sess, "connect.html", clients=connect_context(kit.config, key),
                    with_key=True)

    async def activity(request: Request) -> Response:
        sess = await kit.session_of(request)
        if sess is None:
            return kit.redirect(f"{p}/login")
        if kit.config.consent is not None and await asyncio.to_thread(
                needs_consent, kit.database, kit.config, sess.participant_id):
            return kit.redirect(f"{p}/consent")
        if request.method == "GET":
            held = await asyncio.to_thread(activity_summary, kit.database, sess.participant_id)
            return page(request, sess, "activity.html", held=held, receipt=None)
        ctype = request.headers.get("content-type", "")
        if not ctype.lower().startswith("multipart/form-data"):
            return page(request, sess, "activity.html", 400, held=None, receipt=None,
                        error="The upload could not be read: choose the exported .json file.")
        try:
            body = await read_body(request, kit.max_upload_bytes)
        except BodyTooLarge:
            return page(request, sess, "activity.html", 413, held=None, receipt=None,
                        error=f"The file is over {kit.max_upload_bytes // 2**20} MiB: export a"
                              " shorter time range, or use flowtrial sync-activitywatch.")

        fields = await asyncio.to_thread(_multipart, ctype, body)
        if not kit.signer.check_csrf(sess, fields.get("csrf", b"").decode("ascii", "replace")):
            return kit.forbidden()
        try:
            receipt = await ingest_upload(request.app.state.proxy, kit.database, kit.config,
                                          sess.participant_id, fields.get("export", b""),
                                          "page upload")
        except IngestBusy:
            return page(request, sess, "activity.html", 429, held=None, receipt=None,
                        error="The upload could not be taken now: try again in a few "
                              "seconds.")
        except FlowtrialError as exc:
            return page(request, sess, "activity.html", 422, held=None, receipt=None,
                        error=str(exc))
        return page(request, sess, "activity.html", held=receipt["held"], receipt=receipt,
                    message="Your activity data was received.")

    async def withdraw_route(request: Request) -> Response:
        got = await kit.authed_form(request)
        if isinstance(got, Response):
            return got
        sess, form = got
        delete = form.get("delete") == "yes"
        await asyncio.to_thread(withdraw, kit.database, sess.participant_id, delete_data=delete)
        _tell_proxy(request, sess.participant_id, Standing(False, "participant_withdrawn"))
        text = ("You have withdrawn from the study and every record of yours is deleted."
                if delete else "You have withdrawn from the study: nothing more is recorded.")
        resp = kit.render("message.html", title="Withdrawn", text=text)
        resp.delete_cookie("flowtrial_session", path=p, httponly=True, samesite="strict")
        return resp

    return [Route(f"{p}/consent", consent, methods=["GET", "POST"]),
            Route(f"{p}/connect", connect, methods=["GET", "POST"]),
            Route(f"{p}/activity", activity, methods=["GET", "POST"]),
            Route(f"{p}/withdraw", withdraw_route, methods=["POST"])]
