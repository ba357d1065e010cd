"""The store's errors, apart from db.py so that the CLI maps them without loading SQLAlchemy
and Alembic (a third of a second at every start of a client command)."""


class StoreError(RuntimeError):
    """The database cannot be used as it is: the message says why and what to do."""


class StoreInUse(StoreError):
    """Another process holds this database."""


class StoreClosed(StoreError):
    """The store was closed (the server is stopping): a request still being handled cannot use it."""
