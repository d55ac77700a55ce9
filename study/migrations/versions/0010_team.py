"""Schema version 10 (team studies without a proxy): ``participants.display_name``, the
name a team member opted to show in the team view of an ``observe`` study (team members are
otherwise known only by a salted pseudonym of their identity: ``flowtrial.study.team``), and
``team_turns``, the agent turns rebuilt from telemetry (``flowtrial.study.team_turns``).

Revision ID: 0010
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("participants") as batch_op:
        batch_op.add_column(sa.Column("display_name", sa.String(), nullable=True))
    op.create_table(
        "team_turns",
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column("participant_id", sa.String(), nullable=False),
        sa.Column("agent", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("week", sa.Integer(), nullable=False),
        sa.Column("start_ns", sa.BigInteger(), nullable=False),
        sa.Column("end_ns", sa.BigInteger(), nullable=False),
        sa.Column("first_call_ns", sa.BigInteger(), nullable=True),
        sa.Column("wait_ns", sa.Float(), nullable=False),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("decided", sa.Integer(), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("decide_s", sa.Float(), nullable=False),
        sa.Column("gap_ns", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_team_turns_participant_id", "team_turns", ["participant_id"])
    op.create_index("ix_team_turns_week", "team_turns", ["week"])
    op.create_index("ix_team_turns_participant_start", "team_turns",
                    ["participant_id", "start_ns"])
    op.execute("UPDATE meta SET value = '10' WHERE key = 'schema_version'")


def downgrade() -> None:
    op.drop_table("team_turns")
    with op.batch_alter_table("participants") as batch_op:
        batch_op.drop_column("display_name")
    op.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")
