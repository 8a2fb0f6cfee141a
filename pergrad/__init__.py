"""pergrad: per-example gradient statistics and the optimizers built on them."""

__version__ = "0.1.0"
