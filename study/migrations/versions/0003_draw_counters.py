"""Schema version 3: ``draw_counters``, each participant's next unclaimed per-prompt index.

Per-prompt draws are seeded by a per-participant request index. Version 2 proxies continued
past the highest index recorded when they first saw a participant, so two separate proxies
serving one participant at once could repeat a draw. Proxies now claim blocks of indices
from this table in a transaction. Participants with recorded draws start past their highest
recorded index (or their count of cycles, if higher), as version 2 proxies would have.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "draw_counters",
        sa.Column("participant_id", sa.String(), primary_key=True, nullable=False),
        sa.Column("next_index", sa.BigInteger(), nullable=False),
    )
    conn = op.get_bind()
    start: dict[str, int] = {}
    for pid, n in conn.execute(sa.text(
            "SELECT participant_id, count(*) FROM cycles GROUP BY participant_id")):
        start[pid] = int(n)
    for pid, draw in conn.execute(sa.text(
            "SELECT participant_id, draw_json FROM cycles WHERE draw_json IS NOT NULL")):
        try:
            i = json.loads(draw).get("request_index")
        except (ValueError, AttributeError):
            continue
        if isinstance(i, int):
            start[pid] = max(start.get(pid, 0), i + 1)
    if start:
        op.bulk_insert(sa.table("draw_counters", sa.column("participant_id", sa.String()),
                                sa.column("next_index", sa.BigInteger())),
                       [{"participant_id": p, "next_index": i} for p, i in start.items()])
    op.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")


def downgrade() -> None:
    op.drop_table("draw_counters")
    op.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
