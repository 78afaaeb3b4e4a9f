"""The tensorflow-datasets sources of the encoder tasks (imdb_reviews, trivia_qa).

The tests prepare small data offline with the real tfds builders (their download
step replaced by local archives the tests write) and check that the loaders read
back exactly what was written.
"""

import json

import pytest

from longformer_jax.data import qa_tasks
from tests.test_longformer_tasks import TOKENIZER, tiny_task_config

REVIEWS = {('train', 'pos'): ['A wonderful film.', 'Loved it.'], ('train', 'neg'): ['Dull.'],
           ('test', 'pos'): ['Great acting.'], ('test', 'neg'): ['Awful plot.', 'Boring.']}

TRIVIA = [  # (file, question, aliases, wiki page text)
    ('wikipedia-train.json', 'Which planet is red?', ['Mars', 'Red Planet'],
     'The fourth planet is MARS, often called the red one.'),
    ('wikipedia-train.json', 'Who wrote Hamlet?', ['Shakespeare'], 'No answer in here.'),
    ('wikipedia-dev.json', 'Largest ocean?', ['Pacific', 'Pacific Ocean'],
     'Of all oceans the Pacific Ocean is the largest.'),
    ('wikipedia-test-without-answers.json', 'Smallest ocean?', None, 'The Arctic Ocean.'),
]


def _prepare_imdb(tfds, data_dir, source, monkeypatch):
  import io
  import tarfile
  archive = source / 'aclImdb_v1.tar.gz'
  unlabelled = {('train', 'unsup'): ['Not rated.']}   # the builder's third split
  with tarfile.open(archive, 'w:gz') as tar:
    for (split, label), texts in {**REVIEWS, **unlabelled}.items():
      for i, text in enumerate(texts):
        data = text.encode()
        info = tarfile.TarInfo(f'aclImdb/{split}/{label}/{i}_7.txt')
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
  monkeypatch.setattr(tfds.download.DownloadManager, 'download', lambda self, url: str(archive))
  tfds.builder('imdb_reviews', data_dir=str(data_dir)).download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))


def _prepare_trivia_qa(tfds, data_dir, source, monkeypatch):
  rc = source / 'rc'
  for folder in ('qa', 'evidence/web', 'evidence/wikipedia'):
    (rc / folder).mkdir(parents=True)
  by_file = {}
  for index, (file_name, question, aliases, page) in enumerate(TRIVIA):
    (rc / 'evidence' / 'wikipedia' / f'page{index}.txt').write_text(page, encoding='utf-8')
    record = {'EntityPages': [{'DocSource': 'TagMe', 'Filename': f'page{index}.txt',
                               'Title': 'Page'}],
              'Question': question, 'QuestionId': f'q{index}', 'QuestionSource': 'test',
              'SearchResults': []}
    if aliases:
      record['Answer'] = {'Aliases': aliases, 'NormalizedAliases': [a.lower() for a in aliases],
                          'NormalizedValue': aliases[0].lower(), 'Type': 'WikipediaEntity',
                          'Value': aliases[0]}
    by_file.setdefault(file_name, []).append(record)
  for file_name, records in by_file.items():
    # The builder splits records on lines that are exactly 8 spaces + '{' / '}'.
    body = ',\n'.join('        ' + json.dumps(r, indent=None).replace('{', '{\n', 1)[:-1] + '\n        }'
                      for r in records)
    (rc / 'qa' / file_name).write_text('{"Data": [\n' + body + '\n]}\n', encoding='utf-8')
  monkeypatch.setattr(tfds.download.DownloadManager, 'download_and_extract',
                      lambda self, urls: {'rc': str(rc)})
  tfds.builder('trivia_qa/rc', data_dir=str(data_dir)).download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))


@pytest.fixture(scope='module')
def tfds_task_dir(tmp_path_factory):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from tests.test_data_tfds_corpus import _allow_tfds_building
  root = tmp_path_factory.mktemp('tfds_tasks')
  with pytest.MonkeyPatch.context() as monkeypatch:
    _allow_tfds_building(monkeypatch)
    for name, prepare in (('imdb', _prepare_imdb), ('trivia', _prepare_trivia_qa)):
      (root / name).mkdir()
      prepare(tfds, root / 'data', root / name, monkeypatch)
  return str(root / 'data')


def test_imdb_reviews_loader_reads_the_prepared_reviews(tfds_task_dir):
  from longformer_jax.data import tfds_tasks
  for split, tfds_split in (('train', 'train'), ('valid', 'test')):
    got = sorted(tfds_tasks.imdb_reviews(split, tfds_task_dir))
    want = sorted((text.encode(), int(label == 'pos')) for (s, label), texts in REVIEWS.items()
                  for text in texts if s == tfds_split)
    assert got == want


def test_trivia_qa_loader_finds_the_answer_in_the_evidence(tfds_task_dir):
  from longformer_jax.data import tfds_tasks
  train = tfds_task_dir and tfds_tasks.trivia_qa('train', tfds_task_dir, context_len=30)
  assert [(t.question, t.answer) for t in train] == [(b'Which planet is red?', b'MARS')]
  text = train[0]
  assert len(text.before) + len(text.answer) + len(text.after) == 30
  assert (text.before + text.answer + text.after) in TRIVIA[0][3].encode()
  valid = tfds_tasks.trivia_qa('valid', tfds_task_dir, context_len=100)
  assert [(t.question, t.answer, t.after) for t in valid] == [
      (b'Largest ocean?', b'Pacific', b' Ocean is the largest.')]
  config = tiny_task_config('qa', corpus='trivia_qa', tfds_data_dir=tfds_task_dir, seq_len=64,
                            question_len=24)
  arrays = qa_tasks.load_arrays(config, 'valid', TOKENIZER)
  row = arrays['inputs'][0]
  span = row[arrays['answer_start'][0]:arrays['answer_end'][0] + 1]
  assert TOKENIZER.decode_bytes(span) == b'Pacific'
