"""Schema version 7: ``cycles.served_model``, the model an arm had the upstream serve in place
of the one the client asked for (``[[arms]] model``, with named ``[upstreams.NAME]``); NULL
when the client's own model (``cycles.model``) was served.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cycles") as batch_op:
        batch_op.add_column(sa.Column("served_model", sa.String(), nullable=True))
    op.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'")


def downgrade() -> None:
    with op.batch_alter_table("cycles") as batch_op:
        batch_op.drop_column("served_model")
    op.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
