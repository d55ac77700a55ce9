"""The participant page's routes: plain server-rendered HTML forms, no JavaScript.

``/flowtrial/participant/`` lists the participant's tasks and lets them add one; a task's
page walks through forecast → arm reveal → start → end → questionnaire. Login posts the key
in a form and sets the session cookie (see :mod:`.session`); every other form carries the
session's CSRF token, and a POST whose ``Origin`` is another site's is refused. Responses
are ``no-store`` with a strict Content-Security-Policy (no scripts at all).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from flowtrial.study.config import StudyConfig
from flowtrial.study.participants import PER_PROMPT_ARM, participant_by_key
from flowtrial.study.questionnaire import instruments_for
from flowtrial.study.schema import Participant
from flowtrial.study.storage import Database

from . import field, store
from .session import Session, SessionSigner, new_secret

__all__ = ["COOKIE", "PREFIX", "participant_routes"]

PREFIX = "/flowtrial/participant"
COOKIE = "flowtrial_session"
MAX_FORM_BYTES = 64 * 1024
TEMPLATES = Path(__file__).parent / "templates"
HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    # same-origin (not no-referrer): with no-referrer browsers send "Origin: null" on POSTs.
    "Referrer-Policy": "same-origin",
}
MESSAGES = {
    "added": "Task added. Enter your forecasts before you start.",
    "forecast": "Forecasts recorded.",
    "started": "Task started. Come back here when you are done.",
    "ended": "Task ended. Please answer the short questionnaire.",
    "answered": "Thank you: your answers are recorded.",
    "already": "Your answers to this questionnaire were already recorded.",
    "loggedout": "You are logged out.",
    "reviewed": "The outcome after review is recorded.",
    "consented": "Thank you: your consent is recorded.",
    "uploaded": "Your activity data was received.",
}


class _Forbidden(Exception):
    pass


def _same_origin(request: Request) -> bool:
    """False when the browser says the form came from another site."""
    origin = request.headers.get("origin")
    if origin is None:
        ref = request.headers.get("referer")
        if ref is None:
            return True  # not a browser form post (curl, tests): CSRF needs a browser
        origin = ref
    if origin == "null":
        return False
    host = request.headers.get("host", "")
    return urlsplit(origin).netloc.lower() == host.lower()


async def _form(request: Request) -> dict[str, str]:
    if not _same_origin(request):
        raise _Forbidden
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        raise _Forbidden
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise _Forbidden
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=500)
    except (UnicodeDecodeError, ValueError):
        raise _Forbidden from None
    return {k: v[0] for k, v in parsed.items()}


def _minutes(raw: str | None) -> float | None:
    try:
        v = float((raw or "").strip().replace(",", "."))
    except ValueError:
        return None
    return v * 60.0 if math.isfinite(v) and v > 0 else None


def _arm_text(config: StudyConfig, arm: str | None) -> str:
    if arm is None:
        return ""
    if arm == PER_PROMPT_ARM:
        return "In this study the assistant's speed changes from request to request."
    try:
        a = config.arm(arm)
    except KeyError:
        return ""
    if not a.shaped:
        return "The assistant answers at its normal speed."
    parts = []
    if a.ttft_ms is not None:
        parts.append(f"the assistant's first words come after about {a.ttft_ms / 1000:g} s")
    if a.tokens_per_second is not None:
        parts.append(f"then about {a.tokens_per_second:g} tokens per second")
    if a.delivery == "all_at_once":
        parts.append("the whole answer appears at once")
    return "For this task " + ", ".join(parts) + "."


def participant_routes(database: Database, config: StudyConfig, *,
                       secret: bytes | None = None, prefix: str = PREFIX) -> list[BaseRoute]:
    """The participant page's routes under ``prefix`` (mount them in any Starlette app).

    ``secret``: the session-signing secret (at least 16 bytes); by default a random one for
    this process, so sessions end when the process does.
    """
    signer = SessionSigner(secret if secret is not None else new_secret())
    env = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined,
                      autoescape=select_autoescape(["html"]))
    instruments = instruments_for(config)
    css = (TEMPLATES / "style.css").read_bytes()
    home_url = f"{prefix}/"
    login_url = f"{prefix}/login"

    def task_url(task_id: int) -> str:
        return f"{prefix}/tasks/{task_id}"

    def render(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        ctx.setdefault("message", None)
        ctx.setdefault("error", None)
        html = env.get_template(name).render(prefix=prefix, study=config.study.name, **ctx)
        return HTMLResponse(html, status, headers=HEADERS)

    def redirect(url: str, message: str | None = None) -> RedirectResponse:
        return RedirectResponse(f"{url}?m={message}" if message else url, 303, headers=HEADERS)

    def message(request: Request) -> str | None:
        return MESSAGES.get(request.query_params.get("m", ""))

    def forbidden() -> HTMLResponse:
        return HTMLResponse("<!doctype html><title>Refused</title><p>This form was refused "
                            "(it did not come from this page). Go back, reload and try again.",
                            403, headers=HEADERS)

    def lookup(sess: Session) -> Participant | None:
        with database.session() as s:
            p = s.get(Participant, sess.participant_id)
            if p is None or p.key_id != sess.key_id or p.withdrawn_at is not None or (
                    store.session_revoked(s.connection(), sess.participant_id, sess.nonce)):
                return None
        return p

    async def session_of(request: Request) -> Session | None:
        sess = signer.verify(request.cookies.get(COOKIE))
        if sess is None or await asyncio.to_thread(lookup, sess) is None:
            return None
        return sess

    async def task_page(sess: Session, task_id: int, status: int = 200,
                        error: str | None = None, msg: str | None = None,
                        values: dict[str, str] | None = None) -> Response:
        try:
            task = await asyncio.to_thread(store.get_task, database, sess.participant_id,
                                           task_id)
        except store.PageError:
            return render("message.html", 404, title="No such task", csrf=signer.csrf(sess),
                          participant=sess.participant_id,
                          text="There is no such task among yours.")
        return render("task.html", status, task=task, error=error, message=msg,
                      csrf=signer.csrf(sess), participant=sess.participant_id,
                      arm_text=_arm_text(config, task.arm), instruments=instruments,
                      values=values or {}, design=config.study.design, task_url=task_url)

    async def unconsented(sess: Session) -> bool:
        return config.consent is not None and await asyncio.to_thread(
            field.needs_consent, database, config, sess.participant_id)

    async def home(request: Request) -> Response:
        sess = await session_of(request)
        if sess is None:
            return redirect(login_url)
        if await unconsented(sess):
            return redirect(f"{prefix}/consent")
        tasks = await asyncio.to_thread(store.list_tasks, database, sess.participant_id)
        current = next((t for t in tasks if t.status == "started"), None) or next(
            (t for t in tasks if t.status == "planned"), None)
        return render("home.html", tasks=tasks, current=current, csrf=signer.csrf(sess),
                      participant=sess.participant_id, message=message(request), error=None,
                      task_url=task_url)

    async def login(request: Request) -> Response:
        if request.method == "GET":
            if await session_of(request) is not None:
                return redirect(home_url)
            return render("login.html", error=None, message=message(request))
        try:
            form = await _form(request)
        except _Forbidden:
            return forbidden()
        key = form.get("key", "").strip()
        p = await asyncio.to_thread(participant_by_key, database, key) if key else None
        if p is None:
            return render("login.html", 401, error="That key is not valid: paste the "
                          "participant key you were given (it starts with ft_).", message=None)
        token = signer.issue(p.id, p.key_id)
        sess = signer.verify(token)
        assert sess is not None
        ctx: dict[str, Any] = {"csrf": signer.csrf(sess), "participant": p.id}
        if p.withdrawn_at is not None:
            return render("login.html", 403, error="You have withdrawn from this study: "
                          "this key no longer works.", message=None)
        resp: Response
        if form.get("connect") != "yes":
            resp = redirect(home_url)
        elif config.consent is not None and p.consent_at is None:
            # Asked to see the settings: the key typed here fills them in after consent.
            resp = render("consent.html", consent=config.consent, key=key, **ctx)
        else:
            resp = render("connect.html", clients=field.connect_context(config, key),
                          with_key=True, **ctx)
        resp.set_cookie(COOKIE, token, max_age=signer.ttl_s,
                        path=prefix, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
        return resp

    async def authed_form(request: Request, before_consent: bool = False
                          ) -> tuple[Session, dict[str, str]] | Response:
        """The session and form of a state-changing POST, or the response refusing it."""
        sess = await session_of(request)
        if sess is None:
            return redirect(login_url)
        if not before_consent and await unconsented(sess):
            return redirect(f"{prefix}/consent")
        try:
            form = await _form(request)
        except _Forbidden:
            return forbidden()
        if not signer.check_csrf(sess, form.get("csrf")):
            return forbidden()
        return sess, form

    async def logout(request: Request) -> Response:
        got = await authed_form(request)
        if isinstance(got, Response):
            return got
        sess, _ = got
        # Server-side: the cookie stops working now, wherever a copy of it is.
        await asyncio.to_thread(store.revoke_session, database, sess.participant_id,
                                sess.nonce)
        resp = redirect(login_url, "loggedout")
        resp.delete_cookie(COOKIE, path=prefix, httponly=True, samesite="strict")
        return resp

    async def add(request: Request) -> Response:
        got = await authed_form(request)
        if isinstance(got, Response):
            return got
        sess, form = got
        try:
            tid = await asyncio.to_thread(store.create_task, database, sess.participant_id,
                                          form.get("name", ""), form.get("description"))
        except store.PageError as exc:
            tasks = await asyncio.to_thread(store.list_tasks, database, sess.participant_id)
            return render("home.html", 409, tasks=tasks, current=None, csrf=signer.csrf(sess),
                          participant=sess.participant_id, message=None, error=str(exc),
                          task_url=task_url)
        return redirect(task_url(tid), "added")

    async def task(request: Request) -> Response:
        sess = await session_of(request)
        if sess is None:
            return redirect(login_url)
        if await unconsented(sess):
            return redirect(f"{prefix}/consent")
        return await task_page(sess, request.path_params["task_id"], msg=message(request))

    def action(kind: str) -> Any:
        async def endpoint(request: Request) -> Response:
            got = await authed_form(request)
            if isinstance(got, Response):
                return got
            sess, form = got
            tid: int = request.path_params["task_id"]
            pid = sess.participant_id
            try:
                if kind == "forecast":
                    fast, slow = _minutes(form.get("fast_min")), _minutes(form.get("slow_min"))
                    if fast is None or slow is None:
                        raise store.PageError("enter both forecasts as minutes greater than 0")
                    await asyncio.to_thread(store.submit_forecast, database, config, pid, tid,
                                            fast, slow)
                    return redirect(task_url(tid), "forecast")
                if kind == "start":
                    await asyncio.to_thread(store.start_task, database, pid, tid)
                    return redirect(task_url(tid), "started")
                if kind == "end":
                    await asyncio.to_thread(store.end_task, database, pid, tid,
                                            form.get("status", "done"), form.get("link"))
                    return redirect(task_url(tid), "ended")
                if kind == "review":
                    mins = _minutes(form.get("post_review_min"))
                    if mins is None and (form.get("post_review_min") or "").strip() in (
                            "0", "0.0", "0,0"):
                        mins = 0.0
                    if mins is None:
                        raise store.PageError("enter the time after review in minutes "
                                              "(0 if none)")
                    await asyncio.to_thread(store.record_review, database, pid, tid, mins,
                                            form.get("outcome", ""), form.get("link"))
                    return redirect(task_url(tid), "reviewed")
                answers = store.parse_answers(instruments, form)
                fresh = await asyncio.to_thread(store.submit_answers, database, pid, tid,
                                                answers)
                return redirect(task_url(tid), "answered" if fresh else "already")
            except store.PageError as exc:
                return await task_page(sess, tid, 409, error=str(exc), values=form)

        endpoint.__name__ = f"participant_{kind}"
        return endpoint

    async def style(request: Request) -> Response:
        return Response(css, media_type="text/css",
                        headers={"Cache-Control": "max-age=3600",
                                 "X-Content-Type-Options": "nosniff"})

    async def to_home(request: Request) -> Response:
        return redirect(home_url)

    async def before_consent(request: Request) -> tuple[Session, dict[str, str]] | Response:
        return await authed_form(request, before_consent=True)

    kit = field.PageKit(database, config, prefix, signer, render, redirect, forbidden,
                        session_of, before_consent, config.proxy.max_body_bytes)
    return [
        *field.field_routes(kit),
        Route(prefix, to_home, methods=["GET"]),
        Route(home_url, home, methods=["GET"], name="participant_home"),
        Route(login_url, login, methods=["GET", "POST"], name="participant_login"),
        Route(f"{prefix}/logout", logout, methods=["POST"]),
        Route(f"{prefix}/style.css", style, methods=["GET"]),
        Route(f"{prefix}/tasks", add, methods=["POST"]),
        Route(f"{prefix}/tasks/{{task_id:int}}", task, methods=["GET"]),
        *[Route(f"{prefix}/tasks/{{task_id:int}}/{k}", action(k), methods=["POST"])
          for k in ("forecast", "start", "end", "questionnaire", "review")],
    ]
