"""Thin adapters between SGLang 0.5.17's tensors and :mod:`repro.ddtree`, imported by the patches.

Nothing here builds trees, masks or walks: those come from :mod:`repro.ddtree` (or, on CUDA,
from the fused kernels of :mod:`repro.kernels`: ``tree.py`` picks the path). These helpers
only reshape what SGLang holds (a vocabulary-parallel LM head shard, ``req_to_token`` rows, flat
hidden states) into the inputs ``repro.ddtree`` takes, and write its results back. torch only;
no sglang import, so every function is tested on CPU with fake tensors.
"""
