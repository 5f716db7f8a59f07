"""Programmatic dependent launch (PDL, sm90 and newer) for the DDTree kernels.

A kernel launched with ``launch_pdl=True`` may be scheduled while the kernel before it in the
stream is still running; it first waits (``griddepcontrol.wait``) until that kernel has finished
and its writes are visible, then lets the kernel after it be scheduled in turn. Results are the
same as without PDL; what it saves is the launch gap between back-to-back kernels (in a CUDA
graph too). Each kernel calls :func:`pdl_enter` before its first global memory access.
"""

from __future__ import annotations

import torch


def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on ``device`` can be launched with PDL: a CUDA GPU of compute capability
    9.0 or newer, outside the Triton interpreter (which cannot run the PTX)."""
    if device.type != "cuda":
        return False
    import triton

    return not triton.knobs.runtime.interpret and torch.cuda.get_device_capability(device)[0] >= 9
