"""Schema version 6: ``cycles.t_upstream_first_output_ns``, when the upstream's first output
(answer text or a tool call) reached the proxy.

``t_upstream_first_ns`` is the upstream's first body bytes: for Messages (``message_start``)
and Responses (``response.created``) upstreams that is a structure event sent before the
model has written anything, so the upstream's own TTFT, and whose fault a late first token
was, need the first output's arrival (docs/concepts/manipulation.md). Rows from earlier
versions keep NULL: the check then falls back to the first bytes.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cycles") as batch_op:
        batch_op.add_column(sa.Column("t_upstream_first_output_ns", sa.BigInteger(),
                                      nullable=True))
    op.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")


def downgrade() -> None:
    with op.batch_alter_table("cycles") as batch_op:
        batch_op.drop_column("t_upstream_first_output_ns")
    op.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
