"""The golden set under ``golden/``: its seeded cases and manifest, checked or rebuilt by
``repro golden check|regen``."""
