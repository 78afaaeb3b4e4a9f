"""Object collisions: the Expire-Span paper's task of a rare event queried at any distance.

Sukhbaatar et al. (2021, "Not All Memories are Created Equal: Learning to Forget by
Expiring", the object-collision task) move particles on a grid and ask, at every time step,
where two colours last collided; a model must keep the rare collision steps and may forget
the rest. This generator follows the paper's description and its authors' data script
(`data/gen_data_collisions.py` of facebookresearch/transformer-sequential), written anew:

- `num_particles` particles at real positions in the grid's interior, each with a velocity
  drawn from N(0, speed^2) per axis; a move that would leave the open interval
  (0, grid_size - 1) draws a new velocity until it stays; the cell is the rounded position;
- after each move a particle takes a new random colour with probability `color_change_prob`;
- two particles in the same cell collide: the step records, for their ordered colour pair
  (lower particle index first), the cell and the step, and the pair becomes the most recent;
- each step then writes every particle's (row, column, colour) and a query, a colour pair:
  the most recent collision's with probability `easy_query`, else two uniform colours;
- the label is the quadrant (2 * lower half + right half) of the queried pair's last
  collision, or none when that pair has not collided yet in the episode.

A document is one episode of `steps` steps, 3 * num_particles + 3 byte tokens each: the
particles' triples, the query's two colours, then the answer (with `mark_collisions`, a
diagnostic, a collision mark after the triples). Tokens are printable bytes
(rows 'a'.., columns 'A'.., colours '0'.., query colours '!'.., quadrants '{|}~', none
'_'), so the byte tokenizer reads them as they are. Trained with `data.loss_on='answer'`
the loss counts the quadrant answers alone (not none), as the paper's loss counts only
labelled steps, and the model reads every answer as the blank `HIDDEN_ANSWER` (the none
answer itself): an answer it could read would repeat the answer of the same query a few
steps back, a shortcut the paper's labels (never inputs) do not offer; with
`data.loss_on='all'` every token counts, the answers still read as the blank. The task's
score is benchmarks/collision_accuracy.py's, which reads the answers blank too; the
validation bits per token of train.py and eval.py read the episodes as stored, answers
in view. Episode i of a split is drawn by its own `random.Random(f'{seed}/{split}/{i}')`,
so the data does not depend on the model's seed.

The miniature defaults (grid 8, 3 colours, episodes of 512 steps) make a collision every
61 steps (550 tokens; measured over 64 episodes), where the authors' grid 16 makes one
every 305 steps in a single stream of 50M steps.
"""

import dataclasses
import random

import numpy as np

from longformer_jax.config.section import Section
from longformer_jax.data.document import Document

ROW_BASE, COLUMN_BASE, COLOR_BASE, QUERY_BASE = ord('a'), ord('A'), ord('0'), ord('!')
QUADRANTS = b'{|}~'
# What the model reads in place of every answer; a step whose pair has not collided yet
# answers it too, so that an input never tells a labelled step from another.
HIDDEN_ANSWER = NO_COLLISION = ord('_')
COLLISION_MARK, NO_COLLISION_MARK = ord('*'), ord('.')     # `mark_collisions`
SPLITS = ('train', 'valid', 'test')


@dataclasses.dataclass(frozen=True)
class CollisionsConfig(Section):
  """`data.collisions`: the episodes' world and the split sizes (corpus 'collisions')."""
  grid_size: int = 8                 # cells per side (the paper's data: 16)
  num_particles: int = 2
  num_colors: int = 3                # (the paper's data: 5)
  speed: float = 0.5                 # velocity per axis ~ N(0, speed^2), cells per step
  color_change_prob: float = 0.05    # per particle and step
  easy_query: float = 0.4            # the query asks the most recent collision's pair
  steps: int = 512                   # steps per episode (document)
  # A diagnostic, not the paper's task: each step writes after the particles whether two of
  # them share a cell ('*', else '.'), so a model need not work a collision out to keep it.
  mark_collisions: bool = False
  train_documents: int = 2048
  valid_documents: int = 64
  test_documents: int = 64
  seed: int = 0                      # the data's own seed

  def validate(self, env) -> None:
    del env
    self.require(3 <= self.grid_size <= 26, 'grid_size', 'must be in 3..26 (rows are a..z)')
    self.require(self.num_particles >= 2, 'num_particles', 'must be >= 2 (a collision is two)')
    self.require(1 <= self.num_colors <= 10, 'num_colors', 'must be in 1..10')
    self.require(self.speed > 0.0, 'speed', 'must be > 0')
    for name in ('color_change_prob', 'easy_query'):
      self.require(0.0 <= getattr(self, name) <= 1.0, name, 'must be in [0, 1]')
    self.require(self.steps >= 1, 'steps', 'must be >= 1')
    for name in ('train_documents', 'valid_documents', 'test_documents'):
      self.require(getattr(self, name) >= 1, name, 'must be >= 1')

  def split_size(self, split: str) -> int:
    return getattr(self, f'{split}_documents')

  @property
  def tokens_per_step(self) -> int:
    return 3 * self.num_particles + 3 + int(self.mark_collisions)


@dataclasses.dataclass(frozen=True)
class Episode:
  """One episode. Per step s (all int arrays `[steps]` but `tokens`):

  Attributes:
    tokens: uint8 `[steps * tokens_per_step]`, the document's bytes.
    answer_positions: index in `tokens` of each step's answer.
    labels: the quadrant 0-3 of the queried pair's last collision, -1 for none.
    collided: bool, two particles share a cell after this step's move.
    distance: steps since the answered collision (0: this step's), -1 for none.
    easy: bool, the query asks the most recent collision's pair.
  """
  tokens: np.ndarray
  answer_positions: np.ndarray
  labels: np.ndarray
  collided: np.ndarray
  distance: np.ndarray
  easy: np.ndarray


def quadrant(row, column, grid_size: int):
  """0-3: 2 * (row in the lower half) + (column in the right half); ints or int arrays."""
  return 2 * (2 * np.asarray(row) >= grid_size).astype(int) + (2 * np.asarray(column) >= grid_size)


def generate_episode(config: CollisionsConfig, rng: random.Random) -> Episode:
  """An episode of `config.steps` steps drawn with `rng` (module docstring)."""
  size, count = config.grid_size, config.num_particles
  positions = [[rng.random() * (size - 1), rng.random() * (size - 1)] for _ in range(count)]
  velocities = [[rng.gauss(0.0, config.speed), rng.gauss(0.0, config.speed)]
                for _ in range(count)]
  colors = [rng.randrange(config.num_colors) for _ in range(count)]
  last = {}                  # (color p, color q) -> (row, column, step)
  recent = None
  per_step = config.tokens_per_step
  tokens = np.zeros([config.steps * per_step], np.uint8)
  labels = np.full([config.steps], -1, np.int64)
  distance = np.full([config.steps], -1, np.int64)
  collided = np.zeros([config.steps], bool)
  easy = np.zeros([config.steps], bool)
  for step in range(config.steps):
    for p in range(count):
      while not all(0.0 < positions[p][a] + velocities[p][a] < size - 1 for a in (0, 1)):
        velocities[p] = [rng.gauss(0.0, config.speed), rng.gauss(0.0, config.speed)]
      positions[p] = [positions[p][a] + velocities[p][a] for a in (0, 1)]
      if rng.random() < config.color_change_prob:
        colors[p] = rng.randrange(config.num_colors)
    cells = [(int(round(x)), int(round(y))) for x, y in positions]
    for p in range(count):
      for q in range(p + 1, count):
        if cells[p] == cells[q]:
          last[(colors[p], colors[q])] = (*cells[p], step)
          recent = (colors[p], colors[q])
          collided[step] = True
    if recent is not None and rng.random() < config.easy_query:
      pair, easy[step] = recent, True
    else:
      pair = (rng.randrange(config.num_colors), rng.randrange(config.num_colors))
      easy[step] = pair == recent
    at = step * per_step
    for p, (row, column) in enumerate(cells):
      tokens[at + 3 * p:at + 3 * p + 3] = (ROW_BASE + row, COLUMN_BASE + column,
                                           COLOR_BASE + colors[p])
    query_at = at + 3 * count
    if config.mark_collisions:
      tokens[query_at] = COLLISION_MARK if collided[step] else NO_COLLISION_MARK
      query_at += 1
    tokens[query_at:query_at + 2] = (QUERY_BASE + pair[0], QUERY_BASE + pair[1])
    if pair in last:
      row, column, when = last[pair]
      labels[step], distance[step] = int(quadrant(row, column, size)), step - when
      tokens[at + per_step - 1] = QUADRANTS[labels[step]]
    else:
      tokens[at + per_step - 1] = NO_COLLISION
  answer_positions = np.arange(per_step - 1, tokens.size, per_step)
  return Episode(tokens=tokens, answer_positions=answer_positions, labels=labels,
                 collided=collided, distance=distance, easy=easy)


def episode(config: CollisionsConfig, split: str, index: int) -> Episode:
  """Episode `index` of `split`: a pure function of the config, the split and the index."""
  return generate_episode(config, random.Random(f'{config.seed}/{split}/{index}'))


def load_documents(config: CollisionsConfig, split: str) -> list[Document]:
  """The split's episodes as documents; `answer_positions` holds each labelled answer's
  index (the steps whose queried pair has collided; `data.loss_on='answer'` counts them).

  Raises:
    ValueError: an unknown split.
  """
  if split not in SPLITS:
    raise ValueError(f'unknown split {split!r} of the collisions corpus; expected one of {SPLITS}')
  documents = []
  for index in range(config.split_size(split)):
    drawn = episode(config, split, index)
    documents.append(Document(
        name=f'collisions/{split}/{index}', data=drawn.tokens.tobytes(),
        answer_positions=tuple(int(p) for p in drawn.answer_positions[drawn.labels >= 0])))
  return documents
