"""Schema version 4: agent turns.

Cycles get what classifies them (``request_kind``, ``kind_rule``), the turn they belong to
(``turn_id``), their ``conversation_key`` and ``client``, and ``t_upstream_last_ns`` (when the
upstream's last event reached the proxy); a new ``turns`` table groups cycles into the wait a
person actually has (docs/concepts/turns.md). Existing cycles keep NULL kinds: ``flowtrial
turns`` infers them and builds their turns.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_CYCLE_COLUMNS = (
    ("request_kind", sa.String()),
    ("kind_rule", sa.String()),
    ("turn_id", sa.String()),
    ("conversation_key", sa.String()),
    ("client", sa.String()),
    ("t_upstream_last_ns", sa.BigInteger()),
)


def upgrade() -> None:
    with op.batch_alter_table("cycles") as batch:
        for name, type_ in _CYCLE_COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))
        batch.create_index("ix_cycles_turn_id", ["turn_id"])
    op.create_table(
        "turns",
        sa.Column("id", sa.String(), primary_key=True, nullable=False),
        sa.Column("participant_id", sa.String(), sa.ForeignKey("participants.id"),
                  nullable=False),
        sa.Column("arm", sa.String(), nullable=False),
        sa.Column("period", sa.Integer(), nullable=True),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("protocol", sa.String(), nullable=False),
        sa.Column("client", sa.String(), nullable=True),
        sa.Column("conversation_key", sa.String(), nullable=True),
        sa.Column("mono_anchor_ns", sa.BigInteger(), nullable=False),
        sa.Column("wall_anchor_ns", sa.BigInteger(), nullable=False),
        sa.Column("t_start_ns", sa.BigInteger(), nullable=False),
        sa.Column("t_end_ns", sa.BigInteger(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model_calls", sa.Integer(), nullable=False),
        sa.Column("side_calls", sa.Integer(), nullable=False),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("tool_calls", sa.Integer(), nullable=False),
        sa.Column("wait_ms", sa.Float(), nullable=True),
        sa.Column("model_ms", sa.Float(), nullable=True),
        sa.Column("injected_ms", sa.Float(), nullable=True),
        sa.Column("tool_ms", sa.Float(), nullable=True),
        sa.Column("gap_ms", sa.Float(), nullable=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("first_cycle_id", sa.String(), nullable=False),
        sa.Column("last_cycle_id", sa.String(), nullable=True),
        sa.Column("simulated", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_turns_participant_id", "turns", ["participant_id"])
    op.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")


def downgrade() -> None:
    op.drop_index("ix_turns_participant_id", "turns")
    op.drop_table("turns")
    with op.batch_alter_table("cycles") as batch:
        batch.drop_index("ix_cycles_turn_id")
        for name, _ in reversed(_CYCLE_COLUMNS):
            batch.drop_column(name)
    op.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
