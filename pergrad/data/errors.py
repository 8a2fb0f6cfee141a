"""The one error type of the data pipeline."""


class DataError(ValueError):
  """A dataset that is missing or unusable; the message names the problem and the fix."""
