"""The serve stubs (repro/data/stubs) satisfy the module-level imports sglang 0.5.17 makes from them.

Each row is an import statement found at module level in the pinned sglang (the load generator, the
OpenAI entry points, the tool-call detectors, ``sglang/utils.py``); it must succeed against the stub
alone, and using what it imported must say the package is a stub.
"""

import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

STUBS = Path(__file__).resolve().parents[2] / "repro" / "data" / "stubs"

IMPORTS = [  # (the statement, a use of what it imported that must refuse)
    ("from datasets import load_dataset", "load_dataset('mmmu')"),
    ("import soundfile as sf", "sf.read('a.wav')"),
    ("from IPython.display import HTML, display", "display(HTML('x'))"),
    pytest.param("from xgrammar import StructuralTag", "__import__('xgrammar').GrammarCompiler",
                 marks=pytest.mark.skipif(find_spec("pydantic") is None,
                                          reason="the xgrammar stub builds on pydantic, which sglang brings")),
]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    prelude = f"import sys; sys.path.insert(0, {str(STUBS)!r})\n"
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.parametrize(("statement", "use"), IMPORTS)
def test_stub_import_succeeds_and_use_refuses(statement: str, use: str) -> None:
    """The import works against the stub; the use raises and names the stub (xgrammar: sglang's ImportError path)."""
    name = statement.split()[1].split(".", maxsplit=1)[0]
    imported = _run(f"{statement}\nimport {name}\nassert {name}.__repro_stub__, {name}.__file__")
    assert imported.returncode == 0, imported.stderr
    used = _run(f"{statement}\n{use}")
    assert used.returncode != 0
    assert "stub" in used.stderr or "ImportError" in used.stderr or "AttributeError" in used.stderr, used.stderr
