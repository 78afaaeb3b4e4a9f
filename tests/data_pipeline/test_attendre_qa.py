"""The Attendre-style reading-comprehension documents (data/attendre_qa.py)."""

import re

import ml_collections
import numpy as np
import pytest

import train as train_script
from longformer_jax.config.errors import ConfigError
from longformer_jax.data import attendre_qa
from longformer_jax.data.attendre_qa import (ATTRIBUTES, QUESTION, exact_match, fact_pattern,
                                             make_document, partial_reader_answer)
from longformer_jax.data.corpus import curriculum_documents, load_corpus
from longformer_jax.data.data_config import DataConfig
from tests.support.tiny_models import tiny_config

DOCUMENTS = [make_document(seed, 2048) for seed in range(200)]


def test_the_answer_is_stated_once_in_the_passage_at_the_offset():
  for document in DOCUMENTS:
    pattern = fact_pattern(document.entity, document.attribute)
    assert document.text.count(pattern) == 1, document.entity
    at = document.prompt.index(pattern)
    assert document.prompt[at:].startswith(f'{pattern} {document.answer}.')
    assert document.answer_offset <= at < document.answer_offset + 400
    assert document.text.endswith(f'Answer: {document.answer}.')


def test_the_question_comes_first_and_names_its_entity_and_attribute():
  for document in DOCUMENTS:
    assert document.prompt.startswith(QUESTION.format(attribute=document.attribute,
                                                      entity=document.entity))
    assert document.question == f'Question: what is the {document.attribute} of ' \
                                f'{document.entity}?'
    assert document.answer in ATTRIBUTES[document.attribute]


def test_distractors_name_the_entity_and_state_the_attribute_of_others():
  """Neither the entity's name nor the attribute alone leads to the answer."""
  for document in DOCUMENTS:
    mentions = document.context.count(f" {document.entity}'s ")
    assert mentions >= 3        # the answer passage's two facts and a distractor's
    others = re.findall(rf" (\w+)'s {document.attribute} is ([^.]+)\.", document.context)
    assert len(others) >= 2
    wrong = [(name, value) for name, value in others if name != document.entity]
    assert wrong and all(value != document.answer for _, value in wrong)


def test_lengths_and_depths():
  for document in DOCUMENTS[:50]:
    assert 2048 <= len(document.context) <= 2048 + 400
    assert document.text.isascii()
  depths = np.array([d.depth for d in DOCUMENTS])
  assert depths.min() == 0.0 and depths.max() == 1.0 and 0.4 < depths.mean() < 0.6
  for depth in (0.0, 0.5, 1.0):
    document = make_document(7, 4096, depth)
    relative = (document.answer_offset - len(document.question)) / len(document.prompt)
    assert abs(relative - depth) < 0.1, (depth, relative)


def test_the_same_seed_gives_the_same_document():
  assert make_document(3, 1024) == make_document(3, 1024)
  assert make_document(3, 1024) != make_document(4, 1024)
  assert make_document(3, 1024, 0.5) != make_document(3, 1024)


def test_a_reader_of_the_last_chunk_only_scores_near_chance():
  """The shortcut beside every score: a perfect reader that sees only the context's last
  128 bytes answers only where the fact lies there, and guesses (1 in 12) elsewhere."""
  tail = np.mean([exact_match(partial_reader_answer(d, 128), d.answer) for d in DOCUMENTS])
  whole = np.mean([exact_match(partial_reader_answer(d, 10**6), d.answer) for d in DOCUMENTS])
  in_tail = np.mean([d.answer_offset >= len(d.prompt) - len('\nAnswer: ') - 128
                     for d in DOCUMENTS])
  assert whole == 1.0
  assert tail < 0.2 and abs(tail - (in_tail + (1 - in_tail) / 12)) < 0.06, (tail, in_tail)


def test_exact_match_reads_the_answer_up_to_its_full_stop():
  assert exact_match('teal. Question', 'teal') and exact_match(' teal\n', 'teal')
  assert not exact_match('teals.', 'teal') and not exact_match('', 'teal')


@pytest.mark.parametrize('kwargs, key', [({'context_length': 100}, 'context_length'),
                                         ({'context_length': 1024, 'depth': 1.5}, 'depth')])
def test_bad_values_name_their_key(kwargs, key):
  with pytest.raises(ConfigError) as error:
    make_document(0, **kwargs)
  assert error.value.key.endswith(key)
  assert attendre_qa.MIN_CONTEXT == 256


def qa_data(**values):
  return ml_collections.ConfigDict(
      DataConfig.build(dict(corpus='attendre_qa', chunk_len=128, **values), 'config.data')
      .to_dict())


def test_the_corpus_holds_whole_documents_of_the_configured_contexts():
  documents = load_corpus(qa_data(passkey_min_length=300, passkey_max_length=900), 'valid')
  assert len(documents) == attendre_qa.SPLIT_SIZES['valid']
  texts = [d.data.decode('ascii') for d in documents]
  assert all(re.fullmatch(r"Question: what is the \w+ of \w+\?\nContext:.*\nAnswer: [^.]+\.",
                          text, re.S) for text in texts)
  contexts = [len(t.split('\nContext:')[1].split('\nAnswer:')[0]) for t in texts]
  assert min(contexts) >= 300 and max(contexts) <= 900 + 400
  assert [d.data for d in load_corpus(qa_data(passkey_min_length=300, passkey_max_length=900),
                                      'valid')] == [d.data for d in documents]
  assert len(load_corpus(qa_data(), 'test')) == attendre_qa.SPLIT_SIZES['test']


def test_corpus_settings_name_their_key():
  with pytest.raises(ConfigError, match='config.data.passkey_curriculum_max_length'):
    qa_data(passkey_curriculum_max_length=512)          # without a curriculum
  with pytest.raises(ConfigError, match='config.data.passkey_curriculum_max_length'):
    qa_data(passkey_curriculum_steps=10, passkey_max_length=2048,
            passkey_curriculum_max_length=4096)         # longer than the long contexts
  with pytest.raises(ConfigError, match='config.data.passkey_curriculum_max_length'):
    qa_data(passkey_curriculum_steps=10, passkey_min_length=600, passkey_max_length=2048,
            passkey_curriculum_max_length=500)          # shorter than the shortest
  with pytest.raises(ConfigError, match='config.data.passkey_max_length'):
    qa_data(passkey_max_length=200)
  with pytest.raises(ConfigError, match='config.data.passkey_min_length'):
    qa_data(passkey_min_length=2000)
  with pytest.raises(ConfigError, match='config.eval.split'):
    load_corpus(qa_data(), 'dev')


def test_curriculum_reads_short_contexts_then_the_long_ones():
  short = qa_data(passkey_min_length=300, passkey_max_length=4096, passkey_curriculum_steps=10,
                  passkey_curriculum_max_length=600)
  first = curriculum_documents(short)
  assert len(first) == attendre_qa.SPLIT_SIZES['train']
  contexts = [len(d.data.decode('ascii').split('\nContext:')[1].split('\nAnswer:')[0])
              for d in first]
  assert min(contexts) >= 300 and max(contexts) <= 600 + 400
  later = load_corpus(short, 'train')
  assert max(len(d.data) for d in later[:200]) > 2 * max(len(d.data) for d in first)
  default = curriculum_documents(qa_data(passkey_max_length=4096, passkey_curriculum_steps=10))
  assert max(len(d.data) for d in default) <= attendre_qa.DEFAULT_MAX_CONTEXT + 600


@pytest.mark.slow      # a train.py smoke run on the corpus, an Attendre memory in the loop
def test_a_tiny_attendre_model_trains_on_the_corpus(tmp_path):
  config = tiny_config(attention='attendre', mem_len=0,
                       attendre={'memory_size': 16, 'policy': 'lra_max', 'admission': 'score'})
  config.data.update(corpus='attendre_qa', passkey_max_length=300)
  config.train.update(num_steps=2, checkpoint_every=2)
  state, metrics = train_script.train(config, str(tmp_path))
  assert int(state.step) == 2 and np.isfinite(metrics['loss'])
