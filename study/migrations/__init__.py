"""Alembic migrations of the study database schema (see ``flowtrial.study.migrate``)."""
