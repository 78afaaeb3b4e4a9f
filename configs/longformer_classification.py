"""Longformer encoder for sequence classification (Beltagy et al., 2020, sec. 6).

Default data (`data.corpus = 'stdlib'`): the built-in task (does an excerpt
of a standard-library file contain a top-level `class` statement; balanced,
chance 50%), byte level, 512-token examples (`data.seq_len`, [CLS]
included). Real data: `--config.data.corpus=imdb_reviews
--config.data.tfds_data_dir=DIR` (prepared with `tfds build imdb_reviews`).

  python train.py --config=configs/longformer_classification.py --workdir=workdirs/cls

Global attention on [CLS] (the first token) only; `model.longformer.window`
is one-sided (attention/core/sliding_window.py).
"""

from longformer_jax.config.overrides import merged

# The Longformer encoder shared by the classification, QA and LED configs: the
# default model size (4 layers, d_model 256, 4 heads of 64, d_ff 1024), no
# memory (examples are independent), separate Q/K/V for global tokens (paper,
# sec. 3.1: `longformer.global_projections`), and `longformer.global_tokens`
# = 0: the task's number ([CLS]: 1, QA: question_len + 2).
LONGFORMER_ENCODER = {
    'attention': 'longformer',
    'causal': False,                  # bidirectional encoder
    'dropout_rate': 0.1,
    'longformer': {'window': 64},     # ONE-SIDED window: w tokens each side
}


def get_config() -> dict:
  return {
      'task': 'classification',       # lm | classification | qa | seq2seq
      'model': merged(LONGFORMER_ENCODER, {'num_classes': 2}),
      'data': {'batch_size': 16, 'eval_batch_size': 16},   # corpus: stdlib | imdb_reviews
      'optimizer': {'learning_rate': 5e-4, 'warmup_steps': 50},
      'train': {'num_steps': 600, 'eval_every': 200, 'checkpoint_every': 200,
                'eval_max_examples': 512},                 # per evaluation; 0: the whole split
  }
