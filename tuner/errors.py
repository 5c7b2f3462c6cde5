"""One exception hierarchy, so the CLI can turn every expected failure into one sentence."""


class TunerError(Exception):
    """An expected failure: the CLI prints the message alone and exits with status 2."""


class SpaceError(TunerError):
    """A search-space file is unreadable or invalid."""


class FeasibilityError(TunerError):
    """The compile-only check could not run (not: a config does not fit)."""
