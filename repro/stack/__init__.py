"""The pinned stack and its checks: ``stack.toml`` and ``uv.lock`` read and cross-checked, this
machine's GPUs and the kernels' cubins against them (``repro doctor``, ``repro cubins``), and the
offline wheelhouse for an air-gapped GPU host (``repro wheelhouse``, ``repro install-offline``)."""
