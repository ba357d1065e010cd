"""The schema's history as Alembic migrations (storage/db.py runs them at start)."""
