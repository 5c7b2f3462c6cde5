"""The database layer's own exception, so that ``db/`` depends on nothing above it."""


class DatabaseError(Exception):
    """The database cannot be opened, read or written; the message is one sentence for the user."""
