"""benchmarks/collision_accuracy.py: its scoring against hand counts, and a read of a tiny run."""

import dataclasses

import numpy as np

import train as train_script
from benchmarks import collision_accuracy
from longformer_jax.data import collisions
from tests.support.tiny_models import tiny_config

SMALL = collisions.CollisionsConfig(steps=120, grid_size=5)


def test_scores_count_the_labelled_answers_by_kind_and_distance():
  drawn = [collisions.episode(SMALL, 'test', i) for i in range(3)]
  labels = np.stack([d.labels for d in drawn])
  chosen = np.where(np.arange(SMALL.steps) % 2 == 0, labels, 0)     # right on even steps
  read = dict(drawn=drawn, chosen=chosen, per_step=SMALL.tokens_per_step, chunk_len=16,
              grid_size=SMALL.grid_size, majority=2)
  table = collision_accuracy.accuracy_rows(read)
  labelled = labels >= 0
  even = np.arange(SMALL.steps)[None] % 2 == 0
  expected = np.mean((even | (labels == 0))[labelled])
  assert table['model']['all'] == dict(accuracy=expected, answers=int(labelled.sum()))
  assert table['majority']['all']['accuracy'] == np.mean(labels[labelled] == 2)
  easy = labelled & np.stack([d.easy for d in drawn])
  assert table['model']['easy']['answers'] == easy.sum()
  tokens = np.stack([d.distance for d in drawn]) * SMALL.tokens_per_step
  near = labelled & (tokens < 16 + 256)
  assert table['model']['< 272']['answers'] == near.sum()
  assert table['ideal, reach 272']['< 272']['accuracy'] == 1.0
  # The first particle's quadrant now, from its written row and column.
  rows = np.stack([d.tokens[0::SMALL.tokens_per_step] for d in drawn]) - ord('a')
  columns = np.stack([d.tokens[1::SMALL.tokens_per_step] for d in drawn]) - ord('A')
  here = np.array([[collisions.quadrant(r, c, SMALL.grid_size) for r, c in zip(rr, cc)]
                   for rr, cc in zip(rows, columns)])
  assert table['first particle now']['all']['accuracy'] == np.mean(here[labelled] ==
                                                                    labels[labelled])


def test_a_run_is_read_chunk_by_chunk_with_its_memory_and_spans(tmp_path):
  config = tiny_config(attention='expire_span', mem_len=32)
  section = dict(steps=24, grid_size=4, train_documents=8, valid_documents=2,
                 test_documents=2)
  config.model.update(expire_span={'max_span': 64}, aux_loss_weights={'expire_span_loss': 1e-6})
  config.data.update(corpus='collisions', chunk_len=32, chunks_per_step=1, loss_on='answer',
                     collisions=section)
  config.train.update(num_steps=1, checkpoint_every=1)
  train_script.train(config, str(tmp_path))
  read = collision_accuracy.read_run_episodes(str(tmp_path), 2)
  drawn = [collisions.episode(dataclasses.replace(SMALL, **section), 'test', i)
           for i in range(2)]
  for got, want in zip(read['drawn'], drawn):
    np.testing.assert_array_equal(got.tokens, want.tokens)
  assert read['chosen'].shape == (2, 24) and set(np.unique(read['chosen'])) <= {0, 1, 2, 3}
  assert 0 < read['held_per_layer'] <= 32 and 0 < read['held_share'] <= 1
  assert [s['layer'] for s in read['spans']] == [0, 1]
  assert all(0 <= s['collision'] <= 64 and 0 <= s['other'] <= 64 for s in read['spans'])


def test_the_read_inputs_hide_every_answer_as_training_did():
  drawn = [collisions.episode(SMALL, 'test', i) for i in range(2)]
  arrays = collision_accuracy.episode_arrays(drawn, bos_id=257)
  for row, d in enumerate(drawn):
    shown = d.tokens.astype(np.int32).copy()
    shown[d.answer_positions] = collisions.HIDDEN_ANSWER
    np.testing.assert_array_equal(arrays['inputs'][row], np.concatenate([[257], shown[:-1]]))
  assert arrays['doc_start'][:, 0].all() and not arrays['doc_start'][:, 1:].any()
