"""The database layer's own exception, so that ``db/`` depends on nothing above it."""


class DatabaseError(Exception):
    """The database cannot be opened, read or written; the message is one sentence for the user."""


class DatabaseGoneError(DatabaseError):
    """The file at the database's path is no longer the one opened (deleted, moved or replaced): code that
    tolerates a failed write (e.g. a lost race) must let this one through, since every later write fails too."""


class DatabaseReadOnlyError(DatabaseError):
    """The database is there but this process cannot write it (a read-only file, directory or mount): a command
    that only needs to read it, or finds nothing to write (``tuner db upgrade`` of a current one), goes on."""


QUOTE_MAX = 200  # characters of a user's input a message quotes


def quote(text: object, limit: int = QUOTE_MAX) -> str:
    """``repr(text)``, cut to about ``limit`` characters with the full length said: messages quote
    what the user typed, and a 100 000-character argument must not come back whole."""
    text = str(text)
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f"... ({len(text)} characters)"
