"""The evidence a deployment is judged on: benchmarks against a served profile (``repro bench``),
their results file and summaries, and the verdicts against each profile's thresholds. The handoff
report that presents them (``repro report``) is :mod:`repro.handoff`."""
