"""`config.data`: where the text comes from, how it is tokenized and batched.

The language model reads whole documents as streams of `chunk_len`-token
chunks (`data/train_streams.py`, `data/eval_streams.py`); the encoder tasks read fixed-length
examples (`seq_len`, and `question_len`, `max_answer_len`, `target_len` for
QA and sequence-to-sequence); the image task reads whole images of `corpus`
(`data/image_data.py`: digits | cifar10 | downsampled_imagenet/32x32); the HIBERT tasks
(sentence_mask, extractive) read documents split into sentences (`data/hibert_documents.py`:
stdlib docstrings | a path to text files | cnn_dailymail; shapes in `model.hibert`). A
setting that the run's task does not read is an error (each task's `data_keys`, tasks/).
tensorflow-datasets sources are read from `tfds_data_dir`; a `gs://` one through a local
copy of the one dataset a run reads, kept in `tfds_cache_dir` (`data/tfds_mirror.py`).
"""

import dataclasses

from longformer_jax.config.errors import ConfigError
from longformer_jax.config.section import Section
from longformer_jax.data import attendre_qa
from longformer_jax.data.collisions import CollisionsConfig
from longformer_jax.data.lra.document_matching import RetrievalConfig
from longformer_jax.data.lra.listops import ListOpsConfig
from longformer_jax.data.lra.pathfinder import PathfinderConfig
from longformer_jax.data.lra.text_classification import TextConfig
from longformer_jax.data.token_masking import TokenMaskingConfig

TOKENIZERS = ('byte', 'sentencepiece', 'hf', 'listops')
# The generated corpora with a section of their own (the Long Range Arena's, data/lra/, and
# data/collisions.py): each corpus reads its own section, and only it.
GENERATOR_SECTIONS = {'listops': 'listops', 'pathfinder': 'pathfinder', 'lra_text': 'lra_text',
                      'lra_retrieval': 'lra_retrieval', 'collisions': 'collisions'}
PASSKEY_LENGTHS = ('uniform', 'log_uniform')
LOSS_ON = ('all', 'answer')
ANSWERED_CORPORA = ('passkey', 'attendre_qa', 'collisions')   # their documents hold answers
PASSKEY_KEYS = ('passkey_min_length', 'passkey_max_length', 'passkey_lengths',
                'passkey_curriculum_steps', 'passkey_curriculum_max_length')


@dataclasses.dataclass(frozen=True)
class DataConfig(Section):
  """Data source, tokenizer and batch shape."""
  corpus: str = 'stdlib'             # stdlib | tiny_shakespeare | pg19 | passkey | attendre_qa |
                                     # collisions (tasks: see configs/)
  tfds_data_dir: str = ''            # prepared tensorflow-datasets folder (tfds corpora), or gs://
  # A gs:// tfds_data_dir is read from a copy of the run's one dataset made here (local disk,
  # `~` expanded; data/tfds_mirror.py): <tfds_cache_dir>/BUCKET/DIR/<name>/<config>/<version>.
  tfds_cache_dir: str = '~/.cache/longformer_jax/tfds'
  tokenizer: str = 'byte'            # byte | sentencepiece | hf | listops (ListOps' fixed vocabulary)
  sentencepiece_model: str = ''      # path to a .model file
  tokenizer_file: str = ''           # hf: path to a Hugging Face tokenizer.json
  skip_undecodable: bool = False     # skip (with a warning) documents the tokenizer rejects
  batch_size: int = 8                # global number of rows (streams or examples)
  chunk_len: int = 256               # language model: tokens per chunk (segment length)
  chunks_per_step: int = 1           # language model: chunks scanned per step
  eval_batch_size: int = 8
  seq_len: int = 512                 # tasks: tokens per example
  max_examples: int = 0              # tasks, image, HIBERT: examples per split (0: all)
  tfds_config: str = ''              # tasks: builder config of the tfds data set
  cls_token: bool = True             # classification, retrieval: examples start with [CLS] (the
                                     # global token, and what model.pooling='cls' reads); False:
                                     # the content alone from position 0 (an image's raster)
  cls_global: bool = True            # classification, retrieval: [CLS] is a global token (its
                                     # global_flags bit: attends to and is seen by every token in
                                     # Longformer, BigBird, ETC); False: no global token
  question_len: int = 64             # qa: question tokens kept
  max_answer_len: int = 32           # qa: longest predicted span
  target_len: int = 128              # seq2seq: target tokens, EOS included
  # corpus='passkey' (data/passkey.py): document lengths of every split, in tokens. 0: the
  # shortest that holds needle and question / chunk_len - 1 (one document per chunk).
  # corpus='attendre_qa' (data/attendre_qa.py): context lengths in bytes; 0: 256 / 1,024.
  passkey_min_length: int = 0
  passkey_max_length: int = 0
  passkey_lengths: str = 'uniform'   # uniform | log_uniform (as many documents per octave)
  # Length curriculum (data/curriculum_streams.py): the first N training steps (units of
  # phase 0's step) read short documents, then the passkey_* lengths. 0: off.
  passkey_curriculum_steps: int = 0
  # The curriculum's short documents: passkey, up to this many tokens (0: chunk_len - 1, one
  # document per chunk); attendre_qa, contexts of passkey_min_length to this many bytes
  # (0: 1,024), spread as passkey_lengths says.
  passkey_curriculum_max_length: int = 0
  # Language model: which targets the training loss counts. all | answer: only the answers of
  # corpus passkey / attendre_qa (the tokens after 'Answer: ' / the question, the final '.'
  # included), as an instruction-tuned reader is trained, or collisions (its labelled
  # quadrants; its inputs read every answer as a blank either way). Evaluation counts every
  # token.
  loss_on: str = 'all'
  # The Long Range Arena's generated tasks (docs/lra.md): corpus listops | pathfinder | lra_text
  # | lra_retrieval.
  listops: ListOpsConfig = ListOpsConfig()
  pathfinder: PathfinderConfig = PathfinderConfig()
  lra_text: TextConfig = TextConfig()
  lra_retrieval: RetrievalConfig = RetrievalConfig()
  # corpus='collisions' (data/collisions.py): the Expire-Span paper's object-collision episodes.
  collisions: CollisionsConfig = CollisionsConfig()
  # task='masked_pretraining' (self-pretraining on a task's own inputs): BERT's masking of the
  # examples' tokens (data/token_masking.py).
  masking: TokenMaskingConfig = TokenMaskingConfig()

  def validate(self, env) -> None:
    del env
    self.require(bool(self.tfds_cache_dir) and '://' not in self.tfds_cache_dir,
                 'tfds_cache_dir', 'must be a local folder (the copy of gs:// tfds data that '
                 'TensorFlow reads from local disk)')
    self.require(self.tokenizer in TOKENIZERS, 'tokenizer', f'must be one of {TOKENIZERS}')
    if self.tokenizer == 'hf':
      self.require(bool(self.tokenizer_file), 'tokenizer_file',
                   "must name a tokenizer.json with tokenizer='hf'")
    for name in ('batch_size', 'chunk_len', 'chunks_per_step', 'eval_batch_size'):
      self.require(getattr(self, name) > 0, name, 'must be a positive integer')
    self.require(self.seq_len >= 4, 'seq_len', 'must be >= 4')
    self.require(self.max_examples >= 0, 'max_examples', 'must be >= 0 (0: all)')
    self.require(self.question_len > 0, 'question_len', 'must be >= 1')
    self.require(self.max_answer_len >= 1, 'max_answer_len', 'must be >= 1')
    self.require(self.target_len >= 2, 'target_len', 'must be >= 2')
    self.require(self.passkey_lengths in PASSKEY_LENGTHS, 'passkey_lengths',
                 f'must be one of {PASSKEY_LENGTHS}')
    self.require(self.passkey_min_length >= 0 and self.passkey_max_length >= 0,
                 'passkey_max_length', 'passkey lengths must be >= 0 (0: the default)')
    self.require(self.passkey_curriculum_steps >= 0, 'passkey_curriculum_steps',
                 'must be >= 0 (0: off)')
    self.require(self.loss_on in LOSS_ON, 'loss_on', f'must be one of {LOSS_ON}')
    self.require(self.loss_on == 'all' or self.corpus in ANSWERED_CORPORA, 'loss_on',
                 f"'answer' needs a corpus whose documents end with an answer "
                 f"{ANSWERED_CORPORA}; corpus is {self.corpus!r}")
    self.require(self.corpus != 'collisions' or self.tokenizer == 'byte', 'tokenizer',
                 "must be 'byte' with corpus 'collisions' (its answers are single bytes)")
    self.require((self.corpus == 'listops') == (self.tokenizer == 'listops'), 'tokenizer',
                 "must be 'listops' exactly when data.corpus is 'listops' (its fixed vocabulary)")
    for corpus, name in GENERATOR_SECTIONS.items():
      changed = getattr(self, name).changed()
      if self.corpus != corpus and changed:
        key, value = next(iter(changed.items()))
        raise ConfigError(f'data.{name}.{key}', f'{value!r} is read only by corpus={corpus!r} '
                          f'(corpus is {self.corpus!r})')
    self.require(self.passkey_curriculum_max_length >= 0, 'passkey_curriculum_max_length',
                 'must be >= 0 (0: the default)')
    self.require(not self.passkey_curriculum_max_length or self.passkey_curriculum_steps,
                 'passkey_curriculum_max_length',
                 'is read only with a curriculum (data.passkey_curriculum_steps > 0)')
    if self.corpus == 'attendre_qa':     # the lengths are its contexts', in bytes
      longest = self.passkey_max_length or attendre_qa.DEFAULT_MAX_CONTEXT
      shortest_first = self.passkey_curriculum_max_length or attendre_qa.DEFAULT_MAX_CONTEXT
      if self.passkey_curriculum_steps:
        self.require(max(self.passkey_min_length, attendre_qa.MIN_CONTEXT) <= shortest_first
                     <= longest, 'passkey_curriculum_max_length',
                     f'{shortest_first}: the curriculum\'s contexts must end between the '
                     f'shortest context ({max(self.passkey_min_length, attendre_qa.MIN_CONTEXT)} '
                     f'bytes) and the longest ({longest} bytes)')
      self.require(self.passkey_min_length <= longest, 'passkey_min_length',
                   f'is above the longest context ({longest} bytes)')
      self.require(longest >= attendre_qa.MIN_CONTEXT, 'passkey_max_length',
                   f'{longest}: corpus attendre_qa needs contexts of at least '
                   f'{attendre_qa.MIN_CONTEXT} bytes')
    elif self.corpus != 'passkey':
      for name in PASSKEY_KEYS:
        self.require(getattr(self, name) == getattr(self.defaults(), name), name,
                     "is read only by corpus='passkey' or 'attendre_qa'")
    else:
      longest = self.passkey_max_length or self.chunk_len - 1
      self.require(self.passkey_min_length <= longest, 'passkey_min_length',
                   f'is above the longest document ({longest} tokens)')
      self.require(self.passkey_curriculum_max_length <= longest,
                   'passkey_curriculum_max_length',
                   f'is above the longest document ({longest} tokens)')
