"""The Hydra configs; the wheel ships them as the package `pergrad.configs` (package-dir)."""
