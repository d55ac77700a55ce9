"""Alembic migrations of the study database schema (see ``study.migrate``)."""
