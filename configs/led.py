"""LED: Longformer encoder-decoder for summarisation (Beltagy et al., 2020, sec. 7).

Longformer encoder over the source (global attention on its first token), a
decoder of full causal self-attention and cross-attention, shared tied
embeddings; teacher-forced token loss and accuracy. Default data: the built-in
task (the first 1023 bytes of a standard-library file -> its top-level def and
class names). Real data: `--config.data.corpus=scrolls
--config.data.tfds_config=gov_report --config.data.tfds_data_dir=DIR`.

  python train.py --config=configs/led.py --workdir=workdirs/led
"""

import ml_collections

from configs import default
from configs.longformer_classification import set_longformer_encoder


def get_config() -> ml_collections.ConfigDict:
  c = default.get_config()
  c.task = 'seq2seq'
  set_longformer_encoder(c.model)
  c.model.decoder_layers = 2

  c.data.corpus = 'stdlib'           # stdlib | synthetic | scrolls
  c.data.seq_len = 1024              # source tokens, BOS included
  c.data.target_len = 128            # target tokens, EOS included
  c.data.max_examples = 0
  c.data.tfds_config = ''            # scrolls config ('' = gov_report)
  c.data.batch_size = 8
  c.data.eval_batch_size = 8

  c.optimizer.learning_rate = 5e-4
  c.optimizer.warmup_steps = 50

  c.train.num_steps = 600
  c.train.log_every = 25
  c.train.eval_every = 200
  c.train.eval_max_examples = 256
  c.train.checkpoint_every = 200
  return c
