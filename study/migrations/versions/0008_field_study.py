"""Schema version 8: field studies — consent version, withdrawal and refused requests on
``participants``; a task's link, post-review time and outcome on ``tasks``; the ``audit``
table (withdrawals and deletions, naming no content). docs/researchers/field-study.md.

Revision ID: 0008
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("participants") as batch_op:
        batch_op.add_column(sa.Column("consent_version", sa.String(), nullable=True))
        batch_op.add_column(sa.Column("withdrawn_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("refused_requests", sa.Integer(), nullable=False,
                                      server_default="0"))
    with op.batch_alter_table("tasks") as batch_op:
        batch_op.add_column(sa.Column("link", sa.String(), nullable=True))
        batch_op.add_column(sa.Column("post_review_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("outcome", sa.String(), nullable=True))
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("participant_id", sa.String(), nullable=False),
        sa.Column("detail_json", sa.Text(), nullable=True),
    )
    op.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")


def downgrade() -> None:
    op.drop_table("audit")
    with op.batch_alter_table("tasks") as batch_op:
        for c in ("outcome", "post_review_s", "link"):
            batch_op.drop_column(c)
    with op.batch_alter_table("participants") as batch_op:
        for c in ("refused_requests", "withdrawn_at", "consent_version"):
            batch_op.drop_column(c)
    op.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
