"""GPU experiments as data: rows of ``experiments.toml`` run by ``python3 -m verify.device.experiment``."""
