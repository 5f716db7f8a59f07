"""Serving SGLang for a deployment profile: the profiles and their thresholds, the server's life
and its HTTP client (``repro serve``). The TP-or-EP advice (``repro topology``) is repro.topology."""
