"""Thin adapters between SGLang 0.5.17's tensors and :mod:`repro.round`, imported by the patches.

Nothing here builds trees, masks or walks: the round and its steps come from :mod:`repro.round`
(which picks :mod:`repro.ddtree`'s torch path or :mod:`repro.kernels`). These helpers only
reshape what SGLang holds (a vocabulary-parallel LM head shard, ``req_to_token`` rows, sampling
parameters) into the inputs the round takes. torch only; no sglang import, so every function is
tested on CPU with fake tensors.
"""
