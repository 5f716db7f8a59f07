"""The handoff report (``repro report``): the evidence, the verify tiers and the tuning advice as
Markdown, JSON and PNG plots. It stands above :mod:`repro.evidence` and :mod:`repro.tuning`, which
it reads; neither imports it."""
