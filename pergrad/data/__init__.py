"""Data: TFDS datasets -> tokenizer -> training examples, a pure function of (seed, index).

  data = make_data(DataSpec(...))     # prepares + caches on first use, else loads
  data.train_batch(k)                 # {"inputs", "targets"}: int32[B, T]
  data.eval_batches(n)                # n fixed validation batches
"""

from pergrad.data.errors import DataError
from pergrad.data.pipeline import LMData, make_data
from pergrad.data.spec import DataSpec

__all__ = ["DataError", "DataSpec", "LMData", "make_data"]
