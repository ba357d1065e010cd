"""Alembic's environment: the connection comes from storage/db.py (`migrate`), which runs
every upgrade in the transaction it opens; nothing here reads a URL or a file."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
