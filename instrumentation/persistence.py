"""Passive acceptance: does a completion's text persist in the participant's later prompts?

Clients such as Copilot and Cody check, 30 s, 2 min, 5 min and 10 min after a completion was
shown, whether its text is still in the document (docs/concepts/capture.md). The proxy cannot see
the document, but it sees every later prompt of the same participant — and prompts carry the code
around the cursor (inline completion) or the files the participant attached (chat). So, for
each completion and each interval ``I`` of ``capture.persistence_intervals_s``:

- **evidence**: the participant's prompts sent in ``[t_last_sent + I, t_last_sent + I +
  window_s]`` (``window_s`` defaults to 120 s: a prompt that early after the checkpoint still
  shows the document as it was then);
- **score**: the highest share of the completion's winnowed k-gram hashes
  (:mod:`flowtrial.instrumentation.fingerprints`) found in one of those prompts — 1.0 kept verbatim
  (re-indentation does not matter), about the kept share when the participant kept part of
  it or edited it, 0.0 gone. Hashes that were already in the completion's *own* prompt are
  left out (a completion that repeats code the participant already had proves nothing),
  unless that would leave nothing;
- **persisted**: ``score >= threshold`` (default 0.5); ``checked_against`` is the prompt's
  cycle with the best score.

No row is written for a checkpoint without evidence (no prompt in its window: unknown, not
"gone"), nor before its window has closed, so each row is final when written and the table
is append-only: rows are keyed by (cycle, interval) and running this again adds only what
became decidable since. Only fingerprints are compared: no code is kept unless the study
keeps full content anyway. Intervals are real seconds (a time-compressed study's raw
timeline is scaled by ``time_scale``).
"""

from __future__ import annotations

import bisect
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text

from flowtrial.study.schema import Persistence
from flowtrial.study.storage import Database, WriteBatch, write_rows

from .fingerprints import fingerprint

__all__ = ["DEFAULT_THRESHOLD", "DEFAULT_WINDOW_S", "compute_persistence"]

NS = 1_000_000_000
DEFAULT_THRESHOLD = 0.5
DEFAULT_WINDOW_S = 120.0

_CYCLES = text(
    "SELECT id, participant_id, wall_anchor_ns - mono_anchor_ns AS offset, t_request_ns, "
    "t_last_sent_ns, t_done_ns, content_fingerprint, prompt_fingerprint, content_text, "
    "prompt_text FROM cycles"
)


@dataclass
class _Cycle:
    id: str
    request_ns: int  # UTC epoch ns
    end_ns: int  # t_last_sent (else t_done, else t_request), UTC epoch ns
    content: frozenset[int]
    prompt: frozenset[int]


def _hashes(fp_json: str | None, text_: str | None) -> frozenset[int]:
    if fp_json:
        try:
            vals = json.loads(fp_json)
        except ValueError:
            vals = None
        if isinstance(vals, list):
            return frozenset(int(v) for v in vals)
    if text_:
        return frozenset(fingerprint(text_))
    return frozenset()


def _load(database: Database) -> dict[str, list[_Cycle]]:
    by_pid: dict[str, list[_Cycle]] = defaultdict(list)
    with database.engine.connect() as conn:
        for row in conn.execute(_CYCLES):
            (cid, pid, offset, t_req, t_last, t_done, cfp, pfp, ctext, ptext) = row
            end = t_last if t_last is not None else (t_done if t_done is not None else t_req)
            by_pid[pid].append(_Cycle(cid, int(t_req) + int(offset), int(end) + int(offset),
                                      _hashes(cfp, ctext), _hashes(pfp, ptext)))
    for cycles in by_pid.values():
        cycles.sort(key=lambda c: c.request_ns)
    return by_pid


def _done(database: Database) -> set[tuple[str, float]]:
    with database.engine.connect() as conn:
        return {(r[0], float(r[1])) for r in conn.execute(
            text("SELECT cycle_id, interval_s FROM persistence"))}


def compute_persistence(
    database: Database,
    *,
    intervals_s: Sequence[float] | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    window_s: float = DEFAULT_WINDOW_S,
    now_ns: int | None = None,
) -> int:
    """Check every completion at every interval that is decidable; returns rows written.

    ``intervals_s`` defaults to the study's ``capture.persistence_intervals_s``; ``now_ns``
    (UTC epoch ns, default now) decides which evidence windows have closed.
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError("threshold must be in (0, 1]")
    if window_s <= 0:
        raise ValueError("window_s must be > 0")
    config = database.config()
    scale = float(database.time_scale()) or 1.0
    ivs = sorted({float(i) for i in (intervals_s if intervals_s is not None
                                     else config.capture.persistence_intervals_s)})
    now = time.time_ns() if now_ns is None else now_ns
    done = _done(database)
    rows: list[dict[str, object]] = []
    window = round(window_s / scale * NS)
    for cycles in _load(database).values():
        starts = [c.request_ns for c in cycles]
        for idx, c in enumerate(cycles):
            if not c.content:
                continue  # no answer text (tool calls only, errors) or content not captured
            novel = c.content - c.prompt
            target = novel or c.content
            for iv in ivs:
                if (c.id, iv) in done:
                    continue
                lo = c.end_ns + round(iv / scale * NS)
                hi = lo + window
                if hi > now:
                    continue  # the evidence window is still open: decide later
                i = max(bisect.bisect_left(starts, lo), idx + 1)
                best, best_id = -1.0, None
                while i < len(cycles) and starts[i] <= hi:
                    later = cycles[i]
                    i += 1
                    if not later.prompt:
                        continue  # a prompt without a fingerprint is no evidence
                    score = len(target & later.prompt) / len(target)
                    if score > best:
                        best, best_id = score, later.id
                if best_id is None:
                    continue  # no prompt in the window: unknown
                rows.append({"cycle_id": c.id, "interval_s": iv, "score": round(best, 4),
                             "persisted": best >= threshold, "checked_against": best_id})
    if rows:
        write_rows(database, [WriteBatch(Persistence, rows, ignore_conflicts=True)])
    return len(rows)
