"""The speed-versus-capability design: which contrasts its arms identify
(docs/researchers/speed-vs-capability.md).

Three arms separate the two: (fast model, natural speed), (fast model slowed to the slow
arm's measured latency: ``matched_to``), (slow model, natural speed). The first two differ
only in speed, the last two only in capability; the first and last differ in both, which is
what a trial giving each group one model would measure.
"""

from __future__ import annotations

from .config import StudyConfig

CONTRAST_MEANING = {
    "speed": "same model, different speed: the model at its natural speed against the same "
             "model slowed to the other arm's measured latency",
    "capability": "same speed, different model: the other model at its natural speed "
                  "against the matched arm (its latency)",
    "naive": "both at once: what a trial giving each group one model at its natural speed "
             "measures (speed and capability confounded)",
}


def contrasts(config: StudyConfig) -> dict[str, tuple[str, str]]:
    """The contrasts a speed-vs-capability design identifies: name -> (arm, reference).

    For every matched arm B (model M, slowed to arm C's latency): ``speed`` = the arm
    serving M at its natural speed against B (same model, different speed);
    ``capability`` = C against B (same speed, different model); ``naive`` = the natural
    M arm against C (what a trial giving each group one model would measure)."""
    out: dict[str, tuple[str, str]] = {}
    for b in config.arms:
        if b.matched_to is None:
            continue
        c = config.arm(b.matched_to)
        fast = next((a for a in config.arms if a.model == b.model and a.latency == "natural"
                     and a.name != b.name), None)
        suffix = "" if sum(a.matched_to is not None for a in config.arms) == 1 else f":{b.name}"
        if fast is not None:
            out[f"speed{suffix}"] = (fast.name, b.name)
        if c.model != b.model:
            out[f"capability{suffix}"] = (c.name, b.name)
        if fast is not None and c.model != b.model:
            out[f"naive{suffix}"] = (fast.name, c.name)
    return out
