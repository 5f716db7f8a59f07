"""`repro.ddtree` imports only torch and the standard library (style.md rule 1)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
for name in ("sglang", "sgl_kernel", "flashinfer", "triton", "vllm"):
    sys.modules[name] = None  # any import of these now raises ImportError
import repro.ddtree, repro.ddtree.reference
loaded = sorted({m.split(".")[0] for m in sys.modules if sys.modules[m] is not None})
print(" ".join(loaded))
"""


def test_no_engine_or_kernel_imports():
    """Importing repro.ddtree succeeds with sglang, flashinfer, triton and vllm blocked."""
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout.split()
    assert "repro" in out and "torch" in out
    assert not {"sglang", "sgl_kernel", "flashinfer", "triton", "vllm", "safetensors"} & set(out)
