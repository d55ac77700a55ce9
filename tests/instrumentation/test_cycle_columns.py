"""A ``cycles`` column is declared once (study/schema.py): the proxy's CycleRecord has a field
for every column it stores as it is, made from the table, and its row fills exactly the
table's columns."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any, get_args

from sqlalchemy import create_engine, insert, select

from flowtrial.instrumentation.proxy import recorder
from flowtrial.instrumentation.proxy.recorder import CycleRecord
from flowtrial.study.schema import Cycle

COLUMNS = set(Cycle.__table__.columns.keys())  # type: ignore[attr-defined]
REQUIRED = dict(id="c1", participant_id="p1", protocol="chat", t_request_ns=10,
                mono_anchor_ns=0, wall_anchor_ns=0, started_at=datetime(2026, 1, 1, tzinfo=UTC))


def _record(**fields: Any) -> Any:
    return CycleRecord(**{**REQUIRED, **fields})


def test_every_column_is_a_record_field_or_computed_and_nothing_else() -> None:
    fields = {f.name for f in dataclasses.fields(CycleRecord)}
    stored_as_is = set(recorder._COPIED)
    assert recorder._COMPUTED <= COLUMNS, recorder._COMPUTED - COLUMNS  # no stale names
    assert stored_as_is == COLUMNS - recorder._COMPUTED
    assert stored_as_is <= fields
    # The fields that are not columns are the record's own working state, declared once.
    own = {f.name for f in dataclasses.fields(recorder._RecordCore)}
    assert fields - COLUMNS == own - {"prompt_text"}


def test_the_row_has_exactly_the_tables_columns_for_every_capture() -> None:
    for capture in ("none", "fingerprint", "full"):
        row = _record().row(capture)
        assert set(row) | {"recorded_by"} == COLUMNS, set(row) ^ (COLUMNS - {"recorded_by"})


def test_a_field_takes_its_columns_type_and_default() -> None:
    by_name = {f.name: f for f in dataclasses.fields(CycleRecord)}
    for name, info in Cycle.model_fields.items():
        if name not in recorder._COPIED:
            continue
        assert by_name[name].type == info.annotation, name
        if name in recorder._STARTS:
            assert by_name[name].default == recorder._STARTS[name]
        elif not info.is_required():
            assert by_name[name].default == info.default, name
    assert _record().served_model is None and _record().transport == "http"


def _sentinel(name: str, annotation: Any) -> Any:
    kinds = [a for a in get_args(annotation) or (annotation,) if a is not type(None)]
    kind = kinds[0]
    return {bool: True, int: 7 + len(name), float: 1.5 + len(name), str: f"v-{name}",
            datetime: datetime(2026, 2, 3, tzinfo=UTC)}[kind]


def test_each_stored_as_is_value_reaches_the_database_unchanged() -> None:
    values = {n: _sentinel(n, Cycle.model_fields[n].annotation) for n in recorder._COPIED}
    values.pop("participant_id")  # a foreign key: the test table has no participant
    rec = _record(**values)
    row = rec.row("full")
    table = Cycle.__table__  # type: ignore[attr-defined]
    engine = create_engine("sqlite://")
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(insert(table), [row])
        stored = conn.execute(select(table)).mappings().one()
    assert {n: stored[n] for n in values} == values
