"""Longformer encoder for extractive QA (Beltagy et al., 2020, sec. 6).

Input `[CLS] question [SEP] context`; global attention on [CLS], the question
and [SEP]; start/end logits per token; span F1 and exact match over tokens.
Default data: the built-in task (the first line of a standard-library
function's docstring -> the function's name in an excerpt of its file), byte
level. Real data: `--config.data.corpus=trivia_qa --config.data.tfds_data_dir=DIR`
(`tfds build trivia_qa/rc`).

  python train.py --config=configs/longformer_qa.py --workdir=workdirs/qa
"""

import ml_collections

from configs import default
from configs.longformer_classification import set_longformer_encoder


def get_config() -> ml_collections.ConfigDict:
  c = default.get_config()
  c.task = 'qa'
  set_longformer_encoder(c.model)

  c.data.corpus = 'stdlib'           # stdlib | synthetic | trivia_qa
  c.data.seq_len = 512               # [CLS] question [SEP] context
  c.data.question_len = 64           # question tokens kept
  c.data.max_answer_len = 32         # longest predicted span, tokens
  c.data.max_examples = 20000        # per split; 0: all
  c.data.tfds_config = ''            # trivia_qa config ('' = rc)
  c.data.batch_size = 16
  c.data.eval_batch_size = 16

  c.optimizer.learning_rate = 5e-4
  c.optimizer.warmup_steps = 50

  c.train.num_steps = 900
  c.train.log_every = 25
  c.train.eval_every = 300
  c.train.eval_max_examples = 512
  c.train.checkpoint_every = 300
  return c
