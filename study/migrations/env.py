"""Alembic environment: always run programmatically by ``flowtrial.study.migrate`` on a connection
it passes in (there is no alembic.ini; the database is the one the user named with ``--db``)."""

from __future__ import annotations

# Alembic loads this file by path, not as part of the package: imports are absolute.
from alembic import context
from sqlalchemy import text

from flowtrial.study.schema import metadata

config = context.config
connection = config.attributes["connection"]

context.configure(
    connection=connection,
    target_metadata=metadata(),
    # SQLite cannot ALTER most things in place: batch mode copies the table instead.
    render_as_batch=True,
    compare_type=True,
)
with context.begin_transaction():
    if connection.dialect.name == "postgresql":
        # Several proxies may start at once against one database: one migrates, the
        # others wait here and then find the schema already at head.
        connection.execute(text("SELECT pg_advisory_xact_lock(872301)"))
    context.run_migrations()
