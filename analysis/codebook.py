"""The codebook of the release package's analysis tables: every column's type, unit and
definition, in one place. ``flowtrial export --release`` writes it into
``datapackage.json`` (Frictionless Table Schema fields) and the docs page
``docs/reference/codebook.md`` is generated from it (cog). A column an analysis table gains
must be added here: the release refuses a column without an entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CODEBOOK", "TABLE_TITLES", "CodebookError", "Column", "field_for", "markdown"]


class CodebookError(KeyError):
    pass


@dataclass(frozen=True)
class Column:
    name: str  # the column, or a regular expression when ``pattern``
    type: str  # Frictionless type: string | integer | number | boolean | datetime
    unit: str | None
    definition: str
    pattern: bool = False


def _c(name: str, type_: str, unit: str | None, definition: str) -> Column:
    return Column(name, type_, unit, definition, pattern=name.startswith("^"))


_PID = _c("participant_id", "string", None, "Participant pseudonym (h_ + keyed hash; the key "
          "is drawn for the release and never written, so it cannot be reversed).")
_ARM = _c("arm", "string", None, "Arm the participant had (per_prompt for per-prompt designs).")
_PERIOD = _c("period", "integer", None, "Crossover period (0 in parallel designs).")
_TASK = _c("task_id", "integer", None, "The task the row belongs to, when known.")

TABLE_TITLES = {
    "cycles": "Per cycle: one prompt → wait → review → decision, as the proxy saw it",
    "turns": "Per agent turn: a person's prompt and every model call until the final answer",
    "tasks": "Per task: arm, forecasts, task time, and the outcome after review",
}

CODEBOOK: dict[str, list[Column]] = {
    "cycles": [
        _c("cycle_id", "string", None, "Cycle pseudonym."), _PID, _ARM, _PERIOD, _TASK,
        _c("protocol", "string", None, "Wire protocol: chat, completions, responses or "
                                       "messages."),
        _c("status", "string", None, "ok, error, upstream_error or abandoned."),
        _c("started_at", "datetime", "UTC", "When the cycle was recorded."),
        _c("request_at", "datetime", "UTC", "When the request reached the proxy."),
        _c("first_sent_at", "datetime", "UTC", "When the first content token left for the "
                                               "client."),
        _c("last_sent_at", "datetime", "UTC", "When the last content token left."),
        _c("t_request_wall_ns", "integer", "ns since 1970-01-01 UTC", "request_at as an "
                                                                       "integer."),
        _c("t_last_sent_wall_ns", "integer", "ns since 1970-01-01 UTC", "last_sent_at as an "
                                                                         "integer."),
        _c("target_ttft_s", "number", "s", "Targeted first-token floor."),
        _c("target_tps", "number", "tokens/s", "Targeted delivery speed."),
        _c("experienced_ttft_s", "number", "s", "First token − request, as the participant "
                                                "saw it."),
        _c("total_wait_s", "number", "s", "Last token − request (the generation wait)."),
        _c("achieved_tps", "number", "tokens/s", "Content tokens after the first over last − "
                                                 "first token."),
        _c("violation", "boolean", None, "The answer missed its schedule by more than 5 ms."),
        _c("violation_s", "number", "s", "By how much the schedule was missed."),
        _c("tokens_completion", "integer", "tokens", "Completion tokens (exact from upstream "
                                                     "usage when given)."),
        _c("idle_wait_s", "number", "s", "Wait with nothing new to read at the study's "
                                         "reading speed (docs/concepts/timeline.md)."),
        _c("delivery", "string", None, "Targeted delivery: stream or all_at_once."),
        _c("switched", "boolean", None, "Context switch during the wait (focus away from the "
                                        "working apps for at least capture.switch_min_away_s, "
                                        "not AFK)."),
        _c(r"^switched_[0-9.]+s$", "boolean", None, "The same at the threshold in its name "
                                                   "(sensitivity)."),
        _c("switch_category", "string", None, "Where focus went (category, else app)."),
        _c("time_away_s", "number", "s", "Not-AFK time away of that switch (0 if none)."),
        _c("resumption_lag_s", "number", "s", "Last token → first focus back in a working "
                                              "app after a switch."),
        _c("afk_overlap_s", "number", "s", "AFK time inside the wait."),
        _c("switch_source", "string", None, "Focus timeline used: client, activitywatch or "
                                            "none."),
        _c("decision", "string", None, "First accept / reject / partial decision, else none."),
        _c("review_time_s", "number", "s", "Decision − last token."),
        _c(r"^persisted_[0-9.]+s$", "boolean", None, "The answer's text persisted in later "
                                                     "prompts at this interval (passive "
                                                     "acceptance); empty when not checked."),
        _c("cycle_time_s", "number", "s", "Request → the participant's next request; empty "
                                          "beyond study.idle_limit_s."),
        _c("open_ended", "boolean", None, "cycle_time_s is empty because of the idle limit."),
    ],
    "turns": [
        _c("turn_id", "string", None, "Turn pseudonym."), _PID, _ARM, _PERIOD, _TASK,
        _c("protocol", "string", None, "Wire protocol of the turn's calls."),
        _c("client", "string", None, "The assistant (client) that sent it, when known."),
        _c("started_at", "datetime", "UTC", "When the turn's first request arrived."),
        _c("model_calls", "integer", "calls", "Model calls of the turn (first + "
                                              "continuations)."),
        _c("side_calls", "integer", "calls", "Side calls (titles, summaries) during it."),
        _c("retries", "integer", "calls", "Retried calls."),
        _c("tool_calls", "integer", "calls", "Tool calls the model asked for."),
        _c("wait_s", "number", "s", "The person's wait for the final answer: model_s + "
                                    "tool_s + gap_s (docs/concepts/turns.md)."),
        _c("model_s", "number", "s", "Time the model calls took, as delivered."),
        _c("injected_s", "number", "s", "Latency the proxy added."),
        _c("tool_s", "number", "s", "Time between a call's end and the next continuation "
                                    "(tools, permission prompts)."),
        _c("gap_s", "number", "s", "Other time inside the turn."),
        _c("status", "string", None, "open, complete or error."),
    ],
    "tasks": [
        _TASK, _PID, _PERIOD, _ARM,
        _c("forecast_fast_s", "number", "s", "The participant's forecast with the fast arm, "
                                             "before the arm was revealed (METR)."),
        _c("forecast_slow_s", "number", "s", "Forecast without it (the slow / control arm)."),
        _c("started_at", "datetime", "UTC", "Task start."),
        _c("ended_at", "datetime", "UTC", "Task end."),
        _c("task_time_s", "number", "s", "End − start (else the imported time)."),
        _c("status", "string", None, "planned, started, done or abandoned."),
        _c("post_review_s", "number", "s", "Implementation time after review (METR's "
                                           "post-review time), entered by the participant."),
        _c("outcome", "string", None, "Final outcome after review: done, abandoned or "
                                      "failed_review."),
        _c("n_cycles", "integer", "cycles", "Cycles linked to the task."),
    ],
}


def field_for(table: str, column: str) -> Column:
    """The codebook entry of ``column`` in ``table``; CodebookError when it has none."""
    for c in CODEBOOK[table]:
        if (re.match(c.name, column) if c.pattern else c.name == column):
            return Column(column, c.type, c.unit, c.definition)
    raise CodebookError(f"the {table} table's column {column!r} has no codebook entry: add it "
                        "to flowtrial/analysis/codebook.py")


def markdown() -> str:
    """The codebook as Markdown tables (docs/reference/codebook.md)."""
    out = []
    for table, cols in CODEBOOK.items():
        out += [f"## {table}.csv", "", TABLE_TITLES[table] + ".", "",
                "| column | type | unit | definition |", "|---|---|---|---|"]
        for c in cols:
            name = f"`{c.name}`" if not c.pattern else f"`{c.name}` (pattern)"
            out.append(f"| {name} | {c.type} | {c.unit or ''} | "
                       f"{c.definition.replace('|', '/')} |")
        out.append("")
    return "\n".join(out)
