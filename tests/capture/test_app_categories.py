"""The app/URL → category mapping, and session tokens of the participant page."""

from __future__ import annotations

import pytest

from flowtrial.instrumentation.participant_page.session import SessionSigner
from flowtrial.study.app_categories import (
    CATEGORIES,
    category_for_app,
    category_for_url,
    host_is_working,
    normalize_app,
    working_set,
)
from flowtrial.study.config import DEFAULT_WORKING_APPS


@pytest.mark.parametrize(("app", "category"), [
    ("Code.exe", "editor"), ("Code", "editor"), ("jetbrains-pycharm", "editor"),
    ("WindowsTerminal.exe", "terminal"), ("iTerm2", "terminal"), ("Google-chrome", "browser"),
    ("Firefox Developer Edition", "browser"), ("Slack", "chat"), ("Microsoft Teams", "chat"),
    ("Thunderbird", "mail"), ("Evince", "docs"), ("Spotify", "other"), (None, "other"),
])
def test_app_categories(app: str | None, category: str) -> None:
    assert category_for_app(app) == category
    assert category in CATEGORIES


@pytest.mark.parametrize(("url", "category"), [
    ("https://mail.google.com/mail/u/0/", "mail"), ("https://app.slack.com/client/T1", "chat"),
    ("https://chatgpt.com/c/1", "chat"), ("https://requests.readthedocs.io/en/latest/", "docs"),
    ("https://docs.example.org/guide", "docs"), ("https://stackoverflow.com/q/1", "docs"),
    ("https://www.youtube.com/watch?v=1", "browser"), ("about:blank", "browser"),
    (None, "browser"),
])
def test_url_categories(url: str | None, category: str) -> None:
    assert category_for_url(url) == category


def test_default_working_apps_are_editors_or_terminals() -> None:
    # The study's defaults and the category table agree (a working app is never "other").
    assert {category_for_app(a) for a in DEFAULT_WORKING_APPS} == {"editor", "terminal"}
    work = working_set(["Code", "claude.ai"])
    assert normalize_app("Code.app") in work
    assert host_is_working("https://www.claude.ai/chat/1", work) == "claude.ai"
    assert host_is_working("https://claude.ai.evil.example/", work) is None


def test_session_tokens() -> None:
    signer = SessionSigner(b"k" * 32, ttl_s=60)
    token = signer.issue("p01", "kid", now=1000)
    sess = signer.verify(token, now=1030)
    assert sess is not None and (sess.participant_id, sess.key_id) == ("p01", "kid")
    assert signer.verify(token, now=1061) is None  # expired
    body, sig = token.split(".")
    assert signer.verify(f"{body}x.{sig}", now=1030) is None  # tampered body
    assert SessionSigner(b"j" * 32).verify(token, now=1030) is None  # other secret
    assert signer.check_csrf(sess, signer.csrf(sess))
    other = signer.verify(signer.issue("p01", "kid", now=1000), now=1030)
    assert other is not None and not signer.check_csrf(other, signer.csrf(sess))


def test_questionnaire_config_shape() -> None:
    from types import SimpleNamespace

    from pydantic import ValidationError

    from flowtrial.instrumentation.participant_page import QuestionnaireSection, instruments_for

    assert [i.name for i in instruments_for(SimpleNamespace())] == ["flow_short_scale",
                                                                    "nasa_tlx"]
    custom = instruments_for(SimpleNamespace(questionnaire={"instruments": [
        {"name": "nasa_tlx"},
        {"name": "trust", "min": 1, "max": 5, "items": [{"id": "t1", "text": "I trusted it."}]},
    ]}))
    assert [(i.name, i.points[0], i.points[-1], len(i.items)) for i in custom] == [
        ("nasa_tlx", 0, 100, 6), ("trust", 1, 5, 1)]
    assert instruments_for(SimpleNamespace(questionnaire={"enabled": False})) == []
    for bad, msg in (({"instruments": [{"name": "mine"}]}, "has no items"),
                     ({"instruments": [{"name": "x", "max": 0, "items": [
                         {"id": "a", "text": "A"}]}]}, "max must be > min"),
                     ({"instruments": [{"name": "nasa_tlx"}, {"name": "nasa_tlx"}]},
                      "duplicate instrument")):
        with pytest.raises(ValidationError, match=msg):
            QuestionnaireSection.model_validate(bad)
