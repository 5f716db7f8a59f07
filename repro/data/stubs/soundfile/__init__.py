"""Stand-in for soundfile, installed by ``repro install-offline`` (see stack.toml [wheelhouse] stubs).

sglang 0.5.17 imports it at module level in its realtime-audio and speech-recognition endpoints; a
text-only server never reads audio. Any use says soundfile is absent.
"""

__repro_stub__ = True


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)
    msg = f"soundfile.{name}: soundfile is a stub in this install (repro install-offline)"
    raise RuntimeError(msg)
