"""LED: Longformer encoder-decoder for summarisation (Beltagy et al., 2020, sec. 7).

Longformer encoder over the source (global attention on its first token), a
decoder of full causal self-attention and cross-attention, shared tied
embeddings; teacher-forced token loss and accuracy. Default data
(`data.corpus = 'stdlib'`): the built-in task (the first 1023 bytes of a
standard-library file -> its top-level def and class names; targets of
`data.target_len` = 128 tokens, EOS included). Real data:
`--config.data.corpus=scrolls --config.data.tfds_config=gov_report
--config.data.tfds_data_dir=DIR`.

  python train.py --config=configs/led.py --workdir=workdirs/led
"""

from configs.longformer_classification import LONGFORMER_ENCODER
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return {
      'task': 'seq2seq',
      'model': merged(LONGFORMER_ENCODER, {'decoder_layers': 2}),
      'data': {'seq_len': 1024},           # source tokens, BOS included
      'optimizer': {'learning_rate': 5e-4, 'warmup_steps': 50},
      'train': {'num_steps': 600, 'eval_every': 200, 'checkpoint_every': 200,
                'eval_max_examples': 256},
  }
