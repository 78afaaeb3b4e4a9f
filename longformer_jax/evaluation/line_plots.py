"""One small PNG line plot, shared by eval.py's reports (memory lengths, sweeps, spans)."""

from typing import Sequence


def save_line_plot(series: Sequence[tuple], path: str, *, xlabel: str, ylabel: str, title: str,
                   log2_x: bool = False, size=(5, 3.5)) -> None:
  """`series`: `(xs, ys, label)` triples (label None: no legend); writes `path`."""
  # deferred: matplotlib (0.8 s to import), only when a report draws a plot; Agg set before pyplot
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  # deferred: matplotlib.pyplot, as above
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=size)
  for xs, ys, label in series:
    ax.plot(xs, ys, marker='o', label=label)
  if log2_x:
    ax.set_xscale('log', base=2)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  if any(label for _, _, label in series):
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
