"""LRA's Text and Retrieval rebuilt from the standard library (data/lra/text_classification.py,
data/lra/document_matching.py): each label checked against the files it was cut from, and no
shortcut (the first 256 bytes, the lengths) gets past chance."""

import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import stdlib_corpus
from longformer_jax.data.lra import document_matching, python_sources, text_classification
from longformer_jax.evaluation import lra_baselines

TEXT = text_classification.TextConfig(min_bytes=512, max_bytes=1023)
RETRIEVAL = document_matching.RetrievalConfig(min_bytes=1024, max_bytes=2047, num_links=16)
SHORTCUT_TRAIN, SHORTCUT_TEST = 1000, 1000


def file_bytes(path: str) -> bytes:
  return (stdlib_corpus.stdlib_root() / path).read_bytes()


def starts_a_line(data: bytes, offset: int) -> bool:
  return offset == 0 or data[offset - 1:offset] == b'\n'


def test_group_and_split_of_paths():
  assert python_sources.group_of('test/test_json/test_dump.py') == 'test'
  assert python_sources.group_of('idlelib/idle_test/htest.py') == 'test'
  assert python_sources.group_of('unittest/test_x.py') == 'test'
  assert python_sources.group_of('json/decoder.py') == 'library'
  assert python_sources.group_of('unittest/case.py') == 'library'
  splits = [python_sources.split_of(f'module_{i}.py') for i in range(2000)]
  assert 0.75 < splits.count('train') / 2000 < 0.85 and splits.count('test') > 150


def test_text_labels_are_the_groups_of_the_two_files_they_were_cut_from():
  for example in text_classification.text_split(TEXT, 'valid', 60):
    first_file, second_file = (file_bytes(path) for path in example.files)
    assert example.files[0] != example.files[1]
    assert example.groups == tuple(python_sources.group_of(p) for p in example.files)
    assert example.label == int(example.groups[0] == example.groups[1])
    assert TEXT.min_bytes <= len(example.data) <= TEXT.max_bytes
    length = len(example.data)
    low = max(length // 3, TEXT.min_first_bytes)
    assert low <= example.cut <= 2 * length // 3
    head, tail = example.data[:example.cut], example.data[example.cut:]
    begin = first_file.find(head)
    assert begin >= 0 and starts_a_line(first_file, begin)
    assert second_file.find(tail) >= 0 and starts_a_line(second_file, second_file.find(tail))
    assert python_sources.split_of(example.files[0]) == 'valid'


def test_retrieval_labels_are_whether_both_documents_cite_the_same_module():
  names = document_matching.link_names(RETRIEVAL.num_links, RETRIEVAL.seed)
  assert len(set(names)) == RETRIEVAL.num_links
  for example in document_matching.retrieval_split(RETRIEVAL, 'valid', 60):
    cited = []
    for document, offset in zip((example.first, example.second), example.link_offsets):
      assert document.count(document_matching.LINK_PREFIX) == 1
      assert starts_a_line(document, offset)
      line = document[offset:document.index(b'\n', offset)]
      cited.append(line[len(document_matching.LINK_PREFIX):].decode())
      assert RETRIEVAL.min_bytes <= len(document) <= RETRIEVAL.max_bytes
    assert tuple(cited) == example.links and set(cited) <= set(names)
    assert example.label == int(cited[0] == cited[1])


def test_the_same_seed_gives_the_same_documents():
  assert (text_classification.text_split(TEXT, 'test', 6)[:3]
          == text_classification.text_split(TEXT, 'test', 3))
  other = text_classification.TextConfig(**dict(TEXT.to_dict(), seed=5))
  assert text_classification.text_split(other, 'test', 3) != text_classification.text_split(
      TEXT, 'test', 3)
  assert (document_matching.retrieval_split(RETRIEVAL, 'train', 4)[:2]
          == document_matching.retrieval_split(RETRIEVAL, 'train', 2))


def fitted_accuracy(train_x, train_y, test_x, test_y) -> float:
  predicted = lra_baselines.softmax_regression(train_x, train_y, test_x, 2, steps=300)
  return lra_baselines.accuracy(predicted, test_y)


@pytest.fixture(scope='module')
def text_sets():
  return (text_classification.text_split(TEXT, 'train', SHORTCUT_TRAIN),
          text_classification.text_split(TEXT, 'test', SHORTCUT_TEST))


def test_text_prefix_and_length_shortcuts_stay_at_chance(text_sets):
  train, test = text_sets
  labels = [np.array([e.label for e in part]) for part in (train, test)]
  prefix = [np.stack([lra_baselines.byte_prefix_features(e.data, buckets=256) for e in part])
            for part in (train, test)]
  lengths = [lra_baselines.length_features([len(e.data) for e in part]) for part in (train, test)]
  assert abs(fitted_accuracy(prefix[0], labels[0], prefix[1], labels[1]) - 0.5) <= 0.05
  assert abs(fitted_accuracy(lengths[0], labels[0], lengths[1], labels[1]) - 0.5) <= 0.05
  # The same features do tell the kind of the first file: the shortcut model can learn.
  kinds = [np.array([e.groups[0] == 'test' for e in part], int) for part in (train, test)]
  assert fitted_accuracy(prefix[0], kinds[0], prefix[1], kinds[1]) >= 0.7


def link_first(document: bytes, offset: int) -> bytes:
  """`document` with its link line moved to the front."""
  end = document.index(b'\n', offset) + 1
  return document[offset:end] + document[:offset] + document[end:]


def test_retrieval_prefix_and_length_shortcuts_stay_at_chance():
  train = document_matching.retrieval_split(RETRIEVAL, 'train', SHORTCUT_TRAIN)
  test = document_matching.retrieval_split(RETRIEVAL, 'test', SHORTCUT_TEST)
  labels = [np.array([e.label for e in part]) for part in (train, test)]

  def prefix(part, move=False):
    def view(e, which):
      document = (e.first, e.second)[which]
      return link_first(document, e.link_offsets[which]) if move else document
    return np.stack([lra_baselines.pair_overlap_features(view(e, 0), view(e, 1)) for e in part])

  def lengths(part):
    return lra_baselines.length_features([[len(e.first), len(e.second)] for e in part])

  assert abs(fitted_accuracy(prefix(train), labels[0], prefix(test), labels[1]) - 0.5) <= 0.05
  assert abs(fitted_accuracy(lengths(train), labels[0], lengths(test), labels[1]) - 0.5) <= 0.05
  # With both citations moved into the first 256 bytes the same model finds them: it can learn.
  in_view = fitted_accuracy(prefix(train, True), labels[0], prefix(test, True), labels[1])
  assert in_view >= 0.62


def test_retrieval_curriculum_pairs_are_short_with_the_same_labels_and_links():
  short = document_matching.curriculum_config(
      document_matching.RetrievalConfig.build(dict(RETRIEVAL.to_dict(), curriculum_steps=5,
                                                    curriculum_max_bytes=200),
                                              'data.lra_retrieval'))
  assert (short.min_bytes, short.max_bytes, short.curriculum_steps) == (64, 200, 0)
  for long, brief in zip(document_matching.retrieval_split(RETRIEVAL, 'train', 40),
                         document_matching.retrieval_split(short, 'train', 40)):
    assert (brief.label, brief.links) == (long.label, long.links)
    for document in (brief.first, brief.second):
      assert 64 <= len(document) <= 200
      assert document.count(document_matching.LINK_PREFIX) == 1


@pytest.mark.parametrize('section, values, key', [
    (text_classification.TextConfig, {'max_bytes': 10}, 'data.lra_text.max_bytes'),
    (document_matching.RetrievalConfig, {'num_links': 1}, 'data.lra_retrieval.num_links'),
    (document_matching.RetrievalConfig, {'curriculum_steps': -1},
     'data.lra_retrieval.curriculum_steps'),
    (document_matching.RetrievalConfig, {'curriculum_min_bytes': 32},
     'data.lra_retrieval.curriculum_min_bytes'),
    (document_matching.RetrievalConfig, {'curriculum_steps': 10, 'curriculum_max_bytes': 5000},
     'data.lra_retrieval.curriculum_max_bytes'),
])
def test_bad_settings_name_their_key(section, values, key):
  with pytest.raises(ConfigError) as error:
    section.build(values, key.rsplit('.', 1)[0])
  assert error.value.key == key


def test_known_cut_reference_answers_whether_the_parts_groups_agree():
  rng = np.random.default_rng(0)

  def part(group):   # group 1 writes 'assert', group 0 'return', among random letters
    filler = bytes(rng.integers(97, 123, 40).astype(np.uint8))
    return filler + (b' assert x' if group else b' return x') + filler

  def documents(count, tied):
    groups = rng.integers(0, 2, (count, 2))
    parts = [(part(a), part(b)) for a, b in groups]
    labels = (groups[:, 0] == groups[:, 1]).astype(int)
    # tied: the groups the regression learns from are the parts' own; else unrelated noise
    return parts, groups if tied else rng.integers(0, 2, (count, 2)), labels

  train_parts, train_groups, _ = documents(300, tied=True)
  test_parts, _, test_labels = documents(200, tied=True)
  assert lra_baselines.known_cut_groups(train_parts, train_groups, test_parts,
                                        test_labels) >= 0.95
  noise_parts, noise_groups, _ = documents(300, tied=False)
  assert abs(lra_baselines.known_cut_groups(noise_parts, noise_groups, test_parts, test_labels)
             - 0.5) <= 0.12
