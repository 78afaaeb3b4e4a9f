"""The tensorflow-datasets sources of the encoder tasks (imdb_reviews, trivia_qa).

The tests prepare small data offline with the real tfds builders (their download
step replaced by local archives the tests write) and check that the loaders read
back exactly what was written.
"""

from longformer_jax.data import qa_tasks
from tests.support.offline_tfds import REVIEWS, TRIVIA
from tests.support.tiny_tasks import TOKENIZER, tiny_task_config


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
