"""The one error an import raises: a one-line message naming the culprit."""


class ConversionError(ValueError):
  """A checkpoint cannot be imported: a missing or unexpected tensor, a shape
  mismatch, an unsupported model type or setting, a missing file."""
