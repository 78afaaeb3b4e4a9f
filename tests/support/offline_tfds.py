"""Small tensorflow-datasets data prepared offline with the real builders: tiny_shakespeare and
pg19 (the tfds corpora), imdb_reviews and trivia_qa (the encoder tasks' sources)."""

import importlib
import importlib.resources
import json
import sys

SHAKESPEARE = ''.join(
    f'CITIZEN {i}:\nBefore we proceed any further, hear me speak.\n\n'
    for i in range(60))

# book_id -> (split, title, text); text without surrounding whitespace,
# which the pg19 builder strips.
BOOKS = {
    101: ('train', 'The First Book', 'Chapter I.\nIt was a dark night.'),
    102: ('train', 'Second Book', 'Ünïcödé café — “quoted” 中文.'),
    103: ('train', 'Third', 'Short.'),
    201: ('validation', 'A Valid Book', 'Validation text\nover two lines.'),
    301: ('test', 'Test Book', 'The end.'),
}


def allow_tfds_building(monkeypatch):
  """tfds 4.9.10 imports `importlib_resources` when it prepares a dataset
  but declares the dependency only for Python < 3.9 (tensorflow/datasets
  issue 11212); the standard library's `importlib.resources` has what it
  uses. Reading prepared data does not need it."""
  try:
    importlib.import_module('importlib_resources')
  except ImportError:
    monkeypatch.setitem(sys.modules, 'importlib_resources',
                        importlib.resources)


def prepare_tiny_shakespeare(tfds, data_dir, source_folder, monkeypatch):
  text_path = source_folder / 'input.txt'
  text_path.write_text(SHAKESPEARE, encoding='utf-8')
  monkeypatch.setattr(tfds.download.DownloadManager, 'download',
                      lambda self, url: str(text_path))
  builder = tfds.builder('tiny_shakespeare', data_dir=str(data_dir))
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))


def prepare_pg19(tfds, data_dir, source_folder, monkeypatch):
  # pylint: disable=g-import-not-at-top
  from tensorflow_datasets.datasets.pg19 import pg19_dataset_builder
  metadata = ''.join(f'{book_id},{title},1900,http://example.org/{book_id}\n'
                     for book_id, (_, title, _) in BOOKS.items())
  (source_folder / 'metadata.csv').write_text(metadata, encoding='utf-8')
  for split in ('train', 'validation', 'test'):
    (source_folder / split).mkdir()
  for book_id, (split, _, text) in BOOKS.items():
    (source_folder / split / f'{book_id}.txt').write_text(text,
                                                          encoding='utf-8')
  assert tfds.builder_cls('pg19') is pg19_dataset_builder.Builder
  monkeypatch.setattr(pg19_dataset_builder, '_DATA_DIR',
                      tfds.core.Path(str(source_folder)))
  builder = tfds.builder('pg19', data_dir=str(data_dir))
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))


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


def prepare_imdb(tfds, data_dir, source, monkeypatch):
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


def prepare_trivia_qa(tfds, data_dir, source, monkeypatch):
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
