"""The DDTREE worker of SGLang 0.5.17 and the thin adapters it runs a round through.

``worker`` is the worker class SGLang loads for DDTREE (patch 0004 only wires it in); it is the one
module here that imports sglang, so only a patched SGLang process imports it. Everything else is
torch only and tested on CPU with fake tensors: ``budgets`` (one state per budget of a schedule),
``draft`` (this rank's LM-head shard), ``slots`` (the verify window of ``req_to_token``), ``sample``
(the target's token per node). Nothing here builds trees, masks or walks: the round and its steps
come from :mod:`repro.round` (which picks :mod:`repro.ddtree`'s torch path or :mod:`repro.kernels`).
"""
