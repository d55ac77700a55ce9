"""The post-task questionnaire: built-in instruments and the proposed ``[questionnaire]``
section of the study file.

Built in (used when the study names no instruments):

``flow_short_scale``
    The ten flow items of the Flow Short Scale (Rheinberg, Vollmeyer & Engeser 2003; English
    version Engeser & Rheinberg 2008), in the past tense, 1 (not at all) … 7 (very much).
``nasa_tlx``
    Raw NASA-TLX (Hart & Staveland 1988; "raw" = unweighted, Hart 2006): six subscales on
    0 … 100 in steps of 5; Performance runs from "Perfect" (0) to "Failure" (100).

Study file shape (``[questionnaire]`` in ``study.toml``)::

    [questionnaire]
    enabled = true                       # false: no questionnaire after tasks

    [[questionnaire.instruments]]
    name = "flow_short_scale"            # a built-in name without items: the built-in items

    [[questionnaire.instruments]]
    name = "nasa_tlx"

    [[questionnaire.instruments]]
    name = "assistant_trust"             # your own instrument
    title = "The assistant"
    min = 1
    max = 5
    low_label = "disagree"
    high_label = "agree"
    items = [
      { id = "trusted", text = "I trusted the assistant's suggestions." },
      { id = "waited", text = "Waiting for the assistant broke my concentration." },
    ]

Answers are stored one row per item in ``questionnaire_answers`` (instrument = the
instrument's ``name``, item = the item's ``id``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "FLOW_SHORT_SCALE", "NASA_TLX", "Instrument", "QuestionnaireItem", "QuestionnaireSection",
    "instruments_for",
]

_ID = r"^[A-Za-z0-9_.\-]+$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QuestionnaireItem(_Strict):
    id: str = Field(min_length=1, max_length=64, pattern=_ID)
    text: str = Field(min_length=1, max_length=500)
    low_label: str | None = None  # overrides the instrument's anchors for this item
    high_label: str | None = None


class Instrument(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=_ID)
    title: str | None = None
    instructions: str | None = None
    min: int = 1
    max: int = 7
    step: int = Field(default=1, gt=0)
    low_label: str | None = None
    high_label: str | None = None
    items: list[QuestionnaireItem] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> Instrument:
        if not self.items:
            builtin = BUILTIN.get(self.name)
            if builtin is None:
                raise ValueError(
                    f"instrument {self.name!r} has no items: list items, or use a built-in "
                    f"name ({', '.join(sorted(BUILTIN))})")
            # A built-in name without items means the built-in instrument, scale included.
            for f in ("title", "instructions", "min", "max", "step", "low_label",
                      "high_label", "items"):
                if f not in self.model_fields_set:
                    object.__setattr__(self, f, getattr(builtin, f))
        if self.max <= self.min:
            raise ValueError(f"instrument {self.name!r}: max must be > min")
        if (self.max - self.min) % self.step:
            raise ValueError(f"instrument {self.name!r}: max - min must be a multiple of step")
        ids = [i.id for i in self.items]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"instrument {self.name!r}: duplicate item id {dupes[0]!r}")
        return self

    @property
    def points(self) -> list[int]:
        return list(range(self.min, self.max + 1, self.step))


FLOW_SHORT_SCALE = Instrument.model_construct(
    name="flow_short_scale",
    title="How did working on this task feel?",
    instructions="Rate each statement about the task you just finished.",
    min=1, max=7, step=1, low_label="not at all", high_label="very much",
    items=[
        QuestionnaireItem(id="fks1", text="I felt just the right amount of challenge."),
        QuestionnaireItem(id="fks2", text="My thoughts and actions ran fluidly and smoothly."),
        QuestionnaireItem(id="fks3", text="I did not notice time passing."),
        QuestionnaireItem(id="fks4", text="I had no difficulty concentrating."),
        QuestionnaireItem(id="fks5", text="My mind was completely clear."),
        QuestionnaireItem(id="fks6", text="I was totally absorbed in what I was doing."),
        QuestionnaireItem(id="fks7", text="The right thoughts and moves came of their own "
                                          "accord."),
        QuestionnaireItem(id="fks8", text="I knew what I had to do each step of the way."),
        QuestionnaireItem(id="fks9", text="I felt that I had everything under control."),
        QuestionnaireItem(id="fks10", text="I was completely lost in thought."),
    ],
)

NASA_TLX = Instrument.model_construct(
    name="nasa_tlx",
    title="Workload (NASA-TLX)",
    instructions="Rate the task you just finished on each scale (0 = very low, 100 = very "
                 "high; for Performance 0 = perfect, 100 = failure).",
    min=0, max=100, step=5, low_label="very low", high_label="very high",
    items=[
        QuestionnaireItem(id="mental", text="Mental demand: how mentally demanding was the "
                                            "task?"),
        QuestionnaireItem(id="physical", text="Physical demand: how physically demanding was "
                                              "the task?"),
        QuestionnaireItem(id="temporal", text="Temporal demand: how hurried or rushed was the "
                                              "pace of the task?"),
        QuestionnaireItem(id="performance", text="Performance: how successful were you in "
                                                 "accomplishing what you were asked to do?",
                          low_label="perfect", high_label="failure"),
        QuestionnaireItem(id="effort", text="Effort: how hard did you have to work to "
                                            "accomplish your level of performance?"),
        QuestionnaireItem(id="frustration", text="Frustration: how insecure, discouraged, "
                                                 "irritated, stressed and annoyed were you?"),
    ],
)

BUILTIN: dict[str, Instrument] = {i.name: i for i in (FLOW_SHORT_SCALE, NASA_TLX)}


class QuestionnaireSection(_Strict):
    """``[questionnaire]`` of the study file."""

    enabled: bool = True
    instruments: list[Instrument] = Field(
        default_factory=lambda: [FLOW_SHORT_SCALE, NASA_TLX])

    @model_validator(mode="after")
    def _unique(self) -> QuestionnaireSection:
        names = [i.name for i in self.instruments]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"questionnaire: duplicate instrument {dupes[0]!r}")
        return self


def instruments_for(config: Any) -> list[Instrument]:
    """The study's post-task instruments (built-in defaults without ``[questionnaire]``)."""
    section = getattr(config, "questionnaire", None)
    if section is None:
        return [FLOW_SHORT_SCALE, NASA_TLX]
    if not isinstance(section, QuestionnaireSection):
        data = section.model_dump() if hasattr(section, "model_dump") else section
        section = QuestionnaireSection.model_validate(data)
    return list(section.instruments) if section.enabled else []
