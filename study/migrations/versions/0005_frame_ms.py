"""Schema version 5: ``cycles.frame_ms``, the delivery granularity a paced cycle used.

Fast arms deliver the tokens due within one display frame together (issue 21,
docs/concepts/shaping.md): ``frame_ms`` is that frame; 0 is one write per token; NULL is not
paced (unshaped, ``all_at_once``, non-streaming). Rows from earlier versions keep NULL: they
were paced per token.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cycles") as batch_op:
        batch_op.add_column(sa.Column("frame_ms", sa.Float(), nullable=True))
    op.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")


def downgrade() -> None:
    with op.batch_alter_table("cycles") as batch_op:
        batch_op.drop_column("frame_ms")
    op.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
