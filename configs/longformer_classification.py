"""Longformer encoder for sequence classification (Beltagy et al., 2020, sec. 6).

Default data: the built-in task (does an excerpt of a standard-library file
contain a top-level `class` statement; balanced, chance 50%), byte level,
512-token examples. Real data: `--config.data.corpus=imdb_reviews
--config.data.tfds_data_dir=DIR` (prepared with `tfds build imdb_reviews`).

  python train.py --config=configs/longformer_classification.py --workdir=workdirs/cls

Global attention on [CLS] (the first token) only; `model.window` is one-sided
(attention/sliding_window.py).
"""

import ml_collections

from configs import default


def set_longformer_encoder(model: ml_collections.ConfigDict) -> None:
  """The Longformer encoder shared by the classification, QA and LED configs."""
  model.attention = 'longformer'
  model.causal = False               # bidirectional encoder
  model.window = 64                  # ONE-SIDED window: w tokens each side
  model.dilation = 1
  model.global_projections = True    # separate Q/K/V for global tokens (paper, sec. 3.1)
  model.global_tokens = 0            # capacity; 0: the task's ([CLS]: 1, QA: question_len + 2)
  model.mem_len = 0                  # examples are independent: no memory
  model.num_layers = 4
  model.d_model = 256
  model.num_heads = 4
  model.head_dim = 64
  model.d_ff = 1024
  model.dropout_rate = 0.1


def get_config() -> ml_collections.ConfigDict:
  c = default.get_config()
  c.task = 'classification'          # lm | classification | qa | seq2seq
  set_longformer_encoder(c.model)
  c.model.num_classes = 2

  c.data.corpus = 'stdlib'           # stdlib | synthetic | imdb_reviews
  c.data.seq_len = 512               # tokens per example, [CLS] included
  c.data.max_examples = 0            # per split; 0: all
  c.data.tfds_config = ''
  c.data.batch_size = 16
  c.data.eval_batch_size = 16

  c.optimizer.learning_rate = 5e-4
  c.optimizer.warmup_steps = 50

  c.train.num_steps = 600
  c.train.log_every = 25
  c.train.eval_every = 200
  c.train.eval_max_examples = 512    # per evaluation; 0: the whole split
  c.train.checkpoint_every = 200
  return c
