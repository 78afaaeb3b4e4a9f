"""Longformer encoder for extractive QA (Beltagy et al., 2020, sec. 6).

Input `[CLS] question [SEP] context`; global attention on [CLS], the question
and [SEP]; start/end logits per token; span F1 and exact match over tokens.
Default data (`data.corpus = 'stdlib'`): the built-in task (the first line
of a standard-library function's docstring -> the function's name in an
excerpt of its file), byte level, 512-token examples with questions of 64
tokens and answers of at most 32 (`data.seq_len`, `question_len`,
`max_answer_len`). Real data: `--config.data.corpus=trivia_qa
--config.data.tfds_data_dir=DIR` (`tfds build trivia_qa/rc`).

  python train.py --config=configs/longformer_qa.py --workdir=workdirs/qa
"""

from configs.longformer_classification import LONGFORMER_ENCODER
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return {
      'task': 'qa',
      'model': merged(LONGFORMER_ENCODER, {}),
      'data': {'max_examples': 20000,      # per split; 0: all
               'batch_size': 16, 'eval_batch_size': 16},
      'optimizer': {'learning_rate': 5e-4, 'warmup_steps': 50},
      'train': {'eval_max_examples': 512},  # per evaluation (every 300 of 900 steps)
  }
