"""Triton side of :mod:`repro.kernels.launch_order` (imported lazily: needs triton)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """With ``PDL``: wait for the previous kernel's writes, then let the next kernel launch.
    Call it before any global memory access; a no-op otherwise."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
