"""The shipped Hydra configs, importable as `pergrad.configs` (pergrad/configs links here)."""
