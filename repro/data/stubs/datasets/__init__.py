"""Stand-in for Hugging Face datasets, installed by ``repro install-offline`` (see stack.toml [wheelhouse] stubs).

sglang 0.5.17's load generator (``sglang.bench_serving``) imports ``load_dataset`` at module level for
its MMMU dataset; a run on a local sharegpt file (``--dataset-path``) never calls it. Any use says
datasets is absent.
"""

__repro_stub__ = True


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)
    msg = f"datasets.{name}: datasets is a stub in this install (repro install-offline)"
    raise RuntimeError(msg)
