"""Schema version 11: what classifying requests by what follows needs (docs/concepts/turns.md).

``cycles.client_sdk`` (the SDK a client used; ``cycles.client`` is now the agent's name),
``cycles.input_key`` (a hash of the request's new user text), ``cycles.offers_tools`` and
``cycles.revised_from`` (the kind and rule a later request's revision replaced, e.g.
``human:new_input`` for a title call recognised once the main request came). Rows from
earlier versions keep NULL: they are never revised.

Revision ID: 0011
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0008"
branch_labels = None
depends_on = None

_COLUMNS = (("client_sdk", sa.String()), ("input_key", sa.String()),
            ("offers_tools", sa.Boolean()), ("revised_from", sa.String()))


def upgrade() -> None:
    with op.batch_alter_table("cycles") as batch_op:
        for name, type_ in _COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))
    op.execute("UPDATE meta SET value = '11' WHERE key = 'schema_version'")


def downgrade() -> None:
    with op.batch_alter_table("cycles") as batch_op:
        for name, _ in _COLUMNS:
            batch_op.drop_column(name)
    op.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")
