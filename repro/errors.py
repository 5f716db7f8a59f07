"""Exceptions a caller is expected to catch. Each subclasses a builtin."""


class ReproError(RuntimeError):
    """A failure of the environment or of a tool we drive (not a bug in our code).

    The CLI prints it as one line, prefixed with the verb, and exits non-zero.
    """


class UsageError(ValueError):
    """A user mistake in arguments or files (bad profile, missing path, bad flag value)."""
