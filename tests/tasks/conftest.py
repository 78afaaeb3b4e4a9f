"""Fixtures more than one test module of tests/tasks/ uses: HIBERT's sentence corpus."""

import itertools

import numpy as np
import pytest

from longformer_jax.data.stdlib_corpus import split_of

WORDS = ('alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu').split()


@pytest.fixture(scope='module')
def corpus(tmp_path_factory) -> str:
  """A folder of text files: 24 train, 4 valid, 4 test documents of 3-7 sentences."""
  root = tmp_path_factory.mktemp('hibert_corpus')
  rng = np.random.default_rng(0)
  wanted = {'train': 24, 'valid': 4, 'test': 4}
  for i in itertools.count():
    name = f'doc{i}.txt'
    split = split_of(name)
    if wanted[split] == 0:
      if not any(wanted.values()):
        break
      continue
    wanted[split] -= 1
    sentences = [' '.join(rng.choice(WORDS, int(rng.integers(2, 5)))).capitalize() + '.'
                 for _ in range(int(rng.integers(3, 8)))]
    (root / name).write_text(sentences[0] + '\n\n' + ' '.join(sentences[1:]))
  return str(root) + '/'
