"""ListOps as LRA generates it (data/lra/listops.py) and its fixed vocabulary, against a separate
evaluator written here: a stack machine over the text form."""

import collections

import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.lra import listops
from longformer_jax.data.lra.listops_tokenizer import VOCABULARY, ListOpsTokenizer

SMALL = listops.ListOpsConfig(min_length=30, max_length=120, max_depth=6)


def evaluate_text(text: str) -> tuple[int, int, int]:
  """`(value, tokens, deepest operator nesting)` of a ListOps tree written as text, by a stack
  machine that shares nothing with the generator (not even its operator code)."""
  stack, tokens, deepest = [], 0, 0
  value = None
  for symbol in text.split():
    if symbol in '()':
      continue
    tokens += 1
    if symbol.startswith('['):
      stack.append((symbol[1:], []))
      deepest = max(deepest, len(stack))
      continue
    if symbol == ']':
      name, args = stack.pop()
      ordered = sorted(args)
      half = len(ordered) // 2
      value = {'MIN': ordered[0], 'MAX': ordered[-1], 'SM': sum(args) % 10,
               'MED': (ordered[half] if len(ordered) % 2 else
                       int(np.floor((ordered[half - 1] + ordered[half]) / 2)))}[name]
    else:
      value = int(symbol)
    if stack:
      stack[-1][1].append(value)
  assert not stack, 'unclosed operator'
  return value, tokens, deepest


def test_every_label_is_the_value_of_its_tree_and_lengths_and_depth_are_bounded():
  trees = listops.listops_split(SMALL, 'train', 300)
  for tree in trees:
    value, tokens, deepest = evaluate_text(tree.text)
    assert value == tree.label
    assert SMALL.min_length < tokens < SMALL.max_length
    assert deepest <= SMALL.max_depth - 1          # the depth-cap nodes are digits
  # Every operator and every label occurs; the arguments respect 2..max_args.
  assert {t.symbols[0] for t in trees} == set(listops.OPERATORS)
  assert set(collections.Counter(t.label for t in trees)) == set(range(10))


def test_lra_lengths_are_strictly_inside_500_and_2000():
  config = listops.ListOpsConfig()
  for tree in listops.listops_split(config, 'test', 8):
    value, tokens, deepest = evaluate_text(tree.text)
    assert 500 < tokens < 2000 and value == tree.label and deepest <= 9


def test_median_of_an_even_count_is_the_floor_of_the_middle_mean():
  assert listops.apply_operator('[MED', [1, 4, 2, 9]) == 3        # floor((2 + 4) / 2)
  assert listops.apply_operator('[MED', [3, 8]) == 5               # floor(5.5)
  assert listops.apply_operator('[MED', [7, 1, 5]) == 5
  assert listops.apply_operator('[SM', [9, 9, 3]) == 1


def test_the_same_seed_gives_the_same_data_and_example_i_ignores_the_count():
  first = listops.listops_split(SMALL, 'valid', 20)
  assert first == listops.listops_split(SMALL, 'valid', 20)
  assert first[:5] == listops.listops_split(SMALL, 'valid', 5)
  other = listops.ListOpsConfig(**dict(SMALL.to_dict(), seed=1))
  assert first != listops.listops_split(other, 'valid', 20)
  assert first != listops.listops_split(SMALL, 'test', 20)


def test_the_vocabulary_is_fixed_and_reads_lra_text_with_parentheses():
  assert VOCABULARY[:3] == ('<pad>', '<cls>', '<eos>')
  assert VOCABULARY[3:13] == tuple('0123456789')
  assert VOCABULARY[13:] == ('[MIN', '[MAX', '[MED', '[SM', ']')
  tokenizer = ListOpsTokenizer()
  tree = listops.listops_split(SMALL, 'train', 1)[0]
  ids = tokenizer.encode(tree.text)
  assert ids.dtype == np.int32 and len(ids) == len(tree.symbols)
  assert tokenizer.decode(ids) == tree.text
  # LRA's TSV writes the same tree with parentheses around every node.
  assert np.array_equal(tokenizer.encode('( ( [MAX 2 ) 9 ) ]'), tokenizer.encode('[MAX 2 9 ]'))
  with pytest.raises(ValueError, match="'\\[MEAN' is not a ListOps symbol"):
    tokenizer.encode('[MEAN 1 2 ]')


@pytest.mark.parametrize('values, key', [
    ({'max_args': 1}, 'data.listops.max_args'),
    ({'min_length': 500, 'max_length': 501}, 'data.listops.max_length'),
    ({'max_depth': 2, 'min_length': 50}, 'data.listops.min_length'),
    ({'operator_probability': 1.0}, 'data.listops.operator_probability'),
])
def test_bad_settings_name_their_key(values, key):
  with pytest.raises(ConfigError) as error:
    listops.ListOpsConfig.build(values, 'data.listops')
  assert error.value.key == key
