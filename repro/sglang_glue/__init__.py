"""The DDTREE worker of SGLang 0.5.17 and the thin adapters it runs a round through.

``worker`` is the worker class SGLang loads for DDTREE (patch 0004 only wires it in) and ``startup``
its start-up (budget states, graph captures, warm-up); they are the modules here that import sglang,
so only a patched SGLang process imports them. Everything else is torch only and tested on CPU:
``budgets`` (one state per budget of a schedule and the server's schedule),
``draft`` (this rank's LM-head shard), ``slots`` (the verify window of ``req_to_token``), ``sample``
(the target's token per node). Nothing here builds trees, masks or walks: the round and its steps
come from :mod:`repro.round` (which picks :mod:`repro.ddtree`'s torch path or :mod:`repro.kernels`).
"""
