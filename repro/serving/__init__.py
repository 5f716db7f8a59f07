"""Serving SGLang for a deployment profile: the profiles and their thresholds, the server's life
and its HTTP client (``repro serve``), and the TP-or-EP advice from the interconnect
(``repro topology``)."""
