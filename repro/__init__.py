"""k26-ddtree-repro: deploy and verify DDTree speculative decoding in SGLang.

The algorithm lives in :mod:`repro.ddtree` (torch + stdlib only), its GPU fast paths in
:mod:`repro.kernels` and one round for every engine in :mod:`repro.round`; the rest is tooling
around it, one package per concern: :mod:`repro.stack` (the pinned stack and its checks),
:mod:`repro.serving`, :mod:`repro.evidence` (benchmarks, verdicts, report), :mod:`repro.tuning`
(the DDTREE budget) and :mod:`repro.golden`.
"""

__version__ = "0.1.0"
