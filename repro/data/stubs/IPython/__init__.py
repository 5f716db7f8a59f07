"""Stand-in for IPython, installed by ``repro install-offline`` (see stack.toml [wheelhouse] stubs).

sglang 0.5.17's ``sglang/utils.py`` imports ``IPython.display`` at module level for notebook helpers
that a server never calls.
"""

__repro_stub__ = True
