"""The participant page: tasks, METR-style forecasts, arm reveal, questionnaires.

Served by the proxy under ``/flowtrial/participant/`` (mount :func:`participant_routes`);
plain server-rendered HTML that works without JavaScript. The questionnaire models import
only pydantic, so the study configuration can use them without loading the web stack.
"""

from __future__ import annotations

from typing import Any

from flowtrial.study.questionnaire import (
    Instrument,
    QuestionnaireItem,
    QuestionnaireSection,
    instruments_for,
)

__all__ = [
    "COOKIE", "PREFIX", "Instrument", "QuestionnaireItem", "QuestionnaireSection",
    "instruments_for", "participant_routes",
]


def __getattr__(name: str) -> Any:
    # The routes (Starlette, Jinja2) load on first use only.
    if name in ("COOKIE", "PREFIX", "participant_routes"):
        from . import routes

        return getattr(routes, name)
    raise AttributeError(name)
