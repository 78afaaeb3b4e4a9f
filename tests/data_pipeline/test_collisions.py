"""The object-collision episodes (data/collisions.py) and their many answers in the streams.

The labels are held to a reference that reads the episode's tokens alone (the cells and
colours each step writes), not the generator's state; the streams' answer masks and hidden
answers to a reference built by plain concatenation, as tests/data_pipeline/test_answer_loss.py
builds the passkey answers'.
"""

import dataclasses

import numpy as np
import pytest

import train as train_script
from longformer_jax.config.errors import ConfigError
from longformer_jax.data import collisions
from longformer_jax.data.byte_tokenizer import ByteTokenizer
from longformer_jax.data.corpus import byte_answer_masks
from longformer_jax.data.data_config import DataConfig
from longformer_jax.data.document import Document
from longformer_jax.data.train_streams import TrainStreams
from tests.support.tiny_models import tiny_config

SMALL = collisions.CollisionsConfig(steps=300, grid_size=6)


def labels_from_tokens(tokens: np.ndarray, config: collisions.CollisionsConfig):
  """Per step: the queried pair's last collision's quadrant (-1: none) and whether any two
  particles share a cell, read from the written cells and colours."""
  per_step, count = config.tokens_per_step, config.num_particles
  last, labels, collided = {}, [], []
  for step in tokens.reshape(-1, per_step).astype(int):
    cells = [(step[3 * p] - ord('a'), step[3 * p + 1] - ord('A')) for p in range(count)]
    colors = [step[3 * p + 2] - ord('0') for p in range(count)]
    hit = False
    for p in range(count):
      for q in range(p + 1, count):
        if cells[p] == cells[q]:
          row, column = cells[p]
          half = config.grid_size / 2
          last[(colors[p], colors[q])] = 2 * (row >= half) + (column >= half)
          hit = True
    marked = int(config.mark_collisions)
    if marked:
      assert step[3 * count] == (ord('*') if hit else ord('.'))
    query = (step[3 * count + marked] - ord('!'), step[3 * count + marked + 1] - ord('!'))
    labels.append(last.get(query, -1))
    collided.append(hit)
  return np.array(labels), np.array(collided)


@pytest.mark.parametrize('config', [SMALL, dataclasses.replace(SMALL, num_particles=3,
                                                               num_colors=2, grid_size=5),
                                    dataclasses.replace(SMALL, mark_collisions=True)])
def test_labels_are_the_queried_pairs_last_collision_read_from_the_tokens(config):
  for index in range(6):
    drawn = collisions.episode(config, 'train', index)
    labels, collided = labels_from_tokens(drawn.tokens, config)
    np.testing.assert_array_equal(drawn.labels, labels)
    np.testing.assert_array_equal(drawn.collided, collided)
    answers = drawn.tokens[drawn.answer_positions]
    expected = np.where(labels >= 0, np.frombuffer(collisions.QUADRANTS, np.uint8)[labels],
                        collisions.NO_COLLISION)
    np.testing.assert_array_equal(answers, expected)
    assert drawn.tokens.size == config.steps * config.tokens_per_step
  # A step without a label answers the blank that hides every answer: no input tells them apart.
  assert collisions.NO_COLLISION == collisions.HIDDEN_ANSWER


def test_episodes_collide_stay_in_the_grid_and_are_fixed_by_seed_split_and_index():
  drawn = [collisions.episode(SMALL, 'train', i) for i in range(8)]
  again = collisions.episode(SMALL, 'train', 3)
  np.testing.assert_array_equal(again.tokens, drawn[3].tokens)
  assert not np.array_equal(collisions.episode(SMALL, 'valid', 3).tokens, drawn[3].tokens)
  other_seed = dataclasses.replace(SMALL, seed=1)
  assert not np.array_equal(collisions.episode(other_seed, 'train', 3).tokens, drawn[3].tokens)
  steps = np.concatenate([d.tokens.reshape(-1, SMALL.tokens_per_step) for d in drawn])
  rows, columns = steps[:, [0, 3]] - ord('a'), steps[:, [1, 4]] - ord('A')
  assert rows.min() >= 0 and rows.max() <= SMALL.grid_size - 1
  assert columns.min() >= 0 and columns.max() <= SMALL.grid_size - 1
  assert sum(d.collided.sum() for d in drawn) > 8
  # Easy queries ask the most recent pair, whose last collision is then the latest one.
  for d in drawn:
    latest = np.maximum.accumulate(np.where(d.collided, np.arange(SMALL.steps), -1))
    easy = d.easy & (latest >= 0)
    np.testing.assert_array_equal(d.distance[easy], (np.arange(SMALL.steps) - latest)[easy])


def test_documents_mark_the_labelled_answers():
  documents = collisions.load_documents(dataclasses.replace(SMALL, valid_documents=3), 'valid')
  assert [d.name for d in documents] == [f'collisions/valid/{i}' for i in range(3)]
  tokens, masks = byte_answer_masks(ByteTokenizer(), documents)
  for document, token, mask in zip(documents, tokens, masks):
    np.testing.assert_array_equal(np.flatnonzero(mask), document.answer_positions)
    assert set(token[mask].tolist()) <= set(collisions.QUADRANTS)
  with pytest.raises(ValueError, match='unknown split'):
    collisions.load_documents(SMALL, 'dev')


def test_marked_answers_count_alone_and_are_read_hidden():
  rng = np.random.default_rng(0)
  docs = [rng.integers(2, 100, size=n).astype(np.int32) for n in (7, 11, 5, 9)]
  masks = [rng.random(d.size) < 0.3 for d in docs]
  hidden, bos, rows, width = 200, 1, 2, 6
  streams = TrainStreams(docs, rows, width, seed=3, bos_id=bos, answer_masks=masks,
                         answer_input_id=hidden)
  batches = [streams.next_batch() for _ in range(8)]
  tokens, marked = [[] for _ in range(rows)], [[] for _ in range(rows)]
  epoch = 0
  while min(len(t) for t in tokens) < 8 * width + 1:
    order = np.random.default_rng([3, epoch]).permutation(len(docs))
    for row in range(rows):
      for doc_id in order[row::rows]:
        tokens[row] += [bos] + docs[doc_id].tolist()
        marked[row] += [False] + masks[doc_id].tolist()
    epoch += 1
  tokens = np.array([t[:8 * width + 1] for t in tokens])
  marked = np.array([m[:8 * width + 1] for m in marked])
  np.testing.assert_array_equal(np.concatenate([b.targets for b in batches], 1), tokens[:, 1:])
  np.testing.assert_array_equal(np.concatenate([b.target_mask for b in batches], 1),
                                marked[:, 1:])
  np.testing.assert_array_equal(np.concatenate([b.inputs for b in batches], 1),
                                np.where(marked[:, :-1], hidden, tokens[:, :-1]))
  counting_all = TrainStreams(docs, rows, width, seed=3, bos_id=bos, answer_masks=masks,
                              answer_input_id=hidden, count_answers_only=False)
  batch = counting_all.batch_at(2)
  np.testing.assert_array_equal(batch.inputs, batches[2].inputs)
  assert batch.target_mask.all()
  with pytest.raises(ValueError, match='do not match'):
    TrainStreams(docs, 1, 4, seed=0, bos_id=bos, answer_masks=masks[:3])
  with pytest.raises(ValueError, match='needs answer_masks'):
    TrainStreams(docs, 1, 4, seed=0, bos_id=bos, answer_input_id=hidden)


def test_answers_need_the_byte_tokenizer():
  class PairTokenizer(ByteTokenizer):
    def encode(self, data):
      return super().encode(data)[::2]
  with pytest.raises(ValueError, match="'collisions/valid/0'.*byte tokenizer"):
    byte_answer_masks(PairTokenizer(), collisions.load_documents(
        dataclasses.replace(SMALL, valid_documents=1), 'valid'))
  assert byte_answer_masks(ByteTokenizer(), [Document('quiet', b'abc')])[1][0].sum() == 0


@pytest.mark.parametrize('values,key', [
    (dict(corpus='collisions', tokenizer='sentencepiece', sentencepiece_model='m.model'),
     'config.data.tokenizer'),
    (dict(corpus='collisions', collisions=dict(grid_size=40)), 'config.data.collisions.grid_size'),
    (dict(corpus='collisions', collisions=dict(num_colors=0)), 'config.data.collisions.num_colors'),
    (dict(corpus='stdlib', collisions=dict(steps=64)), 'config.data.collisions.steps'),
])
def test_bad_settings_name_their_key(values, key):
  with pytest.raises(ConfigError, match=key.replace('.', r'\.')):
    DataConfig.build(values, 'config.data')


def test_a_training_step_counts_the_labelled_answers_alone(tmp_path):
  config = tiny_config(attention='xl', mem_len=16)
  config.data.update(corpus='collisions', chunk_len=32, chunks_per_step=1, loss_on='answer',
                     collisions=dict(steps=40, grid_size=4, train_documents=8,
                                     valid_documents=2, test_documents=2))
  config.train.update(num_steps=1, checkpoint_every=1)
  _, metrics = train_script.train(config, str(tmp_path))
  section = collisions.CollisionsConfig(steps=40, grid_size=4, train_documents=8)
  _, masks = byte_answer_masks(ByteTokenizer(), collisions.load_documents(section, 'train'))
  streams = TrainStreams([m.astype(np.int32) for m in masks], config.data.batch_size, 32,
                         config.seed, bos_id=0, answer_masks=masks)
  assert 0 < metrics['tokens'] == streams.next_batch().target_mask.sum()
  assert np.isfinite(metrics['loss'])
