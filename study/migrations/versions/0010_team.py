"""Schema version 10: ``participants.display_name``, the name a team member opted to show
in the team view of an ``observe`` study (team members are otherwise known only by a
salted pseudonym of their identity: ``flowtrial.study.team``).

Revision ID: 0010
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("participants") as batch_op:
        batch_op.add_column(sa.Column("display_name", sa.String(), nullable=True))
    op.execute("UPDATE meta SET value = '10' WHERE key = 'schema_version'")


def downgrade() -> None:
    with op.batch_alter_table("participants") as batch_op:
        batch_op.drop_column("display_name")
    op.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
