"""Schema version 12: ``team_weeks``, the weekly rollup of a team study's turns (per person,
agent, model and week; ``flowtrial.study.team_rollup``), filled here from the existing
``team_turns`` so the team view reads it at once.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_BINS = [f"w{i:02d}" for i in range(11)]  # WAIT_EDGES_S's bins, as in schema 12


def upgrade() -> None:
    from flowtrial.study.team_rollup import rebuild_rollup

    def col(name: str, type_: type[sa.Integer | sa.Float[float]]) -> sa.Column[Any]:
        return sa.Column(name, type_(), nullable=False)

    op.create_table(
        "team_weeks",
        sa.Column("participant_id", sa.String(), primary_key=True),
        sa.Column("agent", sa.String(), primary_key=True),
        sa.Column("model", sa.String(), primary_key=True),
        sa.Column("week", sa.Integer(), primary_key=True),
        col("turns", sa.Integer), col("calls", sa.Integer), col("wait_ns", sa.Float),
        col("active_ns", sa.Float), col("decided", sa.Integer), col("accepted", sa.Integer),
        col("decide_s", sa.Float), col("switches", sa.Integer), col("captured", sa.Integer),
        *[col(n, sa.Integer) for n in _BINS],
    )
    op.create_index("ix_team_weeks_week", "team_weeks", ["week"])
    rebuild_rollup(op.get_bind())
    op.execute("UPDATE meta SET value = '12' WHERE key = 'schema_version'")


def downgrade() -> None:
    op.drop_table("team_weeks")
    op.execute("DELETE FROM meta WHERE key = 'team_rollup'")
    op.execute("UPDATE meta SET value = '11' WHERE key = 'schema_version'")
