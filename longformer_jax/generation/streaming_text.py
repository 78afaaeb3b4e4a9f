"""Generated tokens to printable text, piece by piece, with stop strings.

`StreamingText` receives the generated token ids one at a time and returns
the text that can be printed now:

- text comes from the tokenizer's own `decode` of every generated id so far
  (byte-level or SentencePiece), so it is exactly what decoding the whole
  output at once gives;
- an incomplete UTF-8 sequence at the end (decoded as U+FFFD replacement
  characters) is held back until later bytes complete it; what is still
  invalid at the end is printed replaced (U+FFFD) by `finish`;
- a stop string ends generation and is not printed, nor is anything after
  it; text that could be the start of a stop string is held back until it
  is known not to be one.

Decoding the whole output at every token costs O(n) per token; generation
costs a chunk forward per token anyway (chunk_window_decoder.py).
"""

from typing import Sequence

REPLACEMENT = '\ufffd'


def stop_position(text: str, stops: Sequence[str]) -> int:
  """Index of the earliest stop string in `text`, or -1."""
  found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
  return min(found) if found else -1


def partial_stop_length(text: str, stops: Sequence[str]) -> int:
  """Length of the longest end of `text` that is a proper start of a stop string."""
  longest = 0
  for stop in stops:
    for n in range(min(len(stop) - 1, len(text)), longest, -1):
      if text.endswith(stop[:n]):
        longest = n
        break
  return longest


class StreamingText:
  """Text of generated tokens as it becomes printable (module doc)."""

  def __init__(self, tokenizer, stops: Sequence[str] = ()):
    """`tokenizer`: has `decode(ids) -> str`; `stops`: non-empty stop strings."""
    if any(not stop for stop in stops):
      raise ValueError('stop strings must be non-empty')
    self.tokenizer = tokenizer
    self.stops = tuple(stops)
    self.ids: list[int] = []
    self.printed = ''
    self.stopped = False

  @property
  def text(self) -> str:
    """All the text printed so far."""
    return self.printed

  def push(self, token_id: int) -> str:
    """Adds a generated token; returns the text to print now ('' once stopped)."""
    if self.stopped:
      return ''
    self.ids.append(int(token_id))
    return self._release(final=False)

  def finish(self) -> str:
    """The text held back at the end (invalid UTF-8 replaced); call once at the end."""
    if self.stopped:
      return ''
    return self._release(final=True)

  def _release(self, final: bool) -> str:
    decoded = self.tokenizer.decode(self.ids)
    if not final:
      decoded = decoded.rstrip(REPLACEMENT)         # maybe an incomplete UTF-8 sequence
    stop_at = stop_position(decoded, self.stops)
    if stop_at >= 0:
      self.stopped = True
      ready = decoded[:stop_at]
    elif final:
      ready = decoded
    else:
      ready = decoded[:len(decoded) - partial_stop_length(decoded, self.stops)]
    if not ready.startswith(self.printed) or len(ready) <= len(self.printed):
      return ''                                     # nothing new (or not stable yet)
    new = ready[len(self.printed):]
    self.printed = ready
    return new
