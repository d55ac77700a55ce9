"""Schema migrations: a database made by an older flowtrial opens in a newer one.

Alembic revisions live in ``study/migrations/versions`` and are numbered like the schema
version (revision ``0002`` is schema version 2). A new database is created from the models
and stamped at head; an older one is upgraded step by step. Databases made before
migrations existed (schema version 1, no ``alembic_version`` table) are first stamped at
``0001``, the revision that describes exactly what they contain.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, text

from . import migrations
from .schema import SCHEMA_VERSION

__all__ = ["current_revision", "head_revision", "stamp_head", "upgrade"]

log = logging.getLogger(__name__)


def revision_for(version: int) -> str:
    return f"{version:04d}"


def head_revision() -> str:
    return revision_for(SCHEMA_VERSION)


def _config(conn: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.attributes["connection"] = conn
    return cfg


def current_revision(conn: Connection) -> str | None:
    """The Alembic revision the database is at (None before migrations existed)."""
    return MigrationContext.configure(conn).get_current_revision()


def stamp_head(conn: Connection) -> None:
    """Mark a database freshly created from the models as being at the head revision."""
    command.stamp(_config(conn), head_revision())


def upgrade(engine: Engine) -> None:
    """Upgrade an older study database to this flowtrial's schema.

    One transaction: on PostgreSQL, several proxies starting at once serialize on an advisory
    lock, and the ones that wait find the work done; on SQLite the DDL is transactional too,
    so a failed migration leaves the database as it was.
    """
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(872301)"))
        version = int(conn.execute(
            text("SELECT value FROM meta WHERE key = 'schema_version'")).scalar_one())
        if version >= SCHEMA_VERSION:
            return  # another process upgraded it while we waited
        log.warning("upgrading study database schema from version %d to %d",
                    version, SCHEMA_VERSION)
        if current_revision(conn) is None:
            command.stamp(_config(conn), revision_for(version))
        command.upgrade(_config(conn), head_revision())
        got = conn.execute(text("SELECT value FROM meta WHERE key = 'schema_version'")).scalar()
        if str(got) != str(SCHEMA_VERSION):  # pragma: no cover - a migration forgot to bump it
            raise RuntimeError(
                f"migration left schema_version at {got}, expected {SCHEMA_VERSION}")
