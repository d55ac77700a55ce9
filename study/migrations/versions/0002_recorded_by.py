"""Schema version 2: ``cycles.recorded_by``, the proxy process that recorded each cycle.

Several proxies (one per site, or behind a load balancer) may now record into one
PostgreSQL database; this column tells their cycles apart. Rows from version 1 keep NULL.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cycles") as batch_op:
        batch_op.add_column(sa.Column("recorded_by", sa.String(), nullable=True))
    op.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")


def downgrade() -> None:
    with op.batch_alter_table("cycles") as batch_op:
        batch_op.drop_column("recorded_by")
    op.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
