"""Stand-in for Hugging Face datasets, installed by ``repro install-offline`` (see stack.toml [wheelhouse] stubs).

sglang 0.5.17's load generator (``sglang.bench_serving``) runs ``from datasets import load_dataset`` at
module level for its MMMU dataset; a run on a local file (``--dataset-path``) never calls it. The name
imports; any call, and any other name, says datasets is absent.
"""

from typing import NoReturn

__repro_stub__ = True
_ABSENT = "datasets is a stub in this install (repro install-offline)"


def load_dataset(*args: object, **kwargs: object) -> NoReturn:
    """Refuse: no datasets here."""
    msg = f"datasets.load_dataset: {_ABSENT}"
    raise RuntimeError(msg)


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)
    msg = f"datasets.{name}: {_ABSENT}"
    raise RuntimeError(msg)
