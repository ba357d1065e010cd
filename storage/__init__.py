"""SQLAlchemy models and queries for the control plane's history (nodes,
devices, jobs, plans, telemetry, events); SQLite by default."""
