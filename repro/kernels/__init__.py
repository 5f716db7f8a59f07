"""GPU kernels (Triton) for the DDTree hot path.

Import submodules explicitly (``from repro.kernels.topk_lse import topk_lse``); nothing here
imports triton, so CPU-only installs import the package freely.
"""
