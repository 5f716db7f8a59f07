"""The drafter test hook: a deterministic stand-in drafter whose rows put the correct token at a
controlled rank, for the tests and the planted targets (``repro.testmodels``).

``hook`` is :class:`~repro.drafter_hook.hook.DrafterTestHook` (the torch reference rows; the
patched SGLang workers load it from ``$SGLANG_DDTREE_TEST_DRAFTER``), ``profiles`` the profile
tables it compiles (``repro/data/drafter_profiles.toml``), ``hashes`` the integer hashes its rows
are drawn from, and ``rows`` the same rows in one Triton launch. It imports neither the SGLang
glue nor the test models: both import it.
"""
