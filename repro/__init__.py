"""k26-ddtree-repro: deploy and verify DDTree speculative decoding in SGLang.

The algorithm lives in :mod:`repro.ddtree` (torch + stdlib only); every other module is tooling
around it (stack pins, doctor, patches, serving, benchmarks, reports).
"""

__version__ = "0.1.0"
