"""The evidence a deployment is judged on: benchmarks against a served profile (``repro bench``),
their results file and summaries, the verdicts against each profile's thresholds, and the handoff
report with its plots (``repro report``)."""
