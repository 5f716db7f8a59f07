"""The two names sglang imports from ``IPython.display``; calling either says IPython is absent."""


def _unavailable(*args: object, **kwargs: object) -> None:
    msg = "IPython is a stub in this install (repro install-offline): install IPython"
    raise RuntimeError(msg)


HTML = _unavailable
display = _unavailable
