"""HIBERT extractive summarisation (Zhang, Wei & Zhou, 2019, sec. 4).

Task `extractive` (`tasks/extractive.py`, `tasks/hibert_extractive.py`): one
logit per sentence from the document encoder, binary cross-entropy against
greedy-ROUGE oracle labels; the metric is ROUGE-1/2/L of the top 3 sentences
(`model.hibert.summary_sentences`) in document order against the reference.
Built-in data: each standard-library docstring's first sentence (its summary
line) is the reference, removed from the document. CNN/DailyMail:
`--config.data.corpus=cnn_dailymail --config.data.tfds_data_dir=DIR`
(articles -> highlights).

The model settings equal configs/hibert.py's, so the encoder of a pretraining
run can start the fine-tuning:

  python train.py --config=configs/hibert.py --workdir=workdirs/hibert
  python train.py --config=configs/hibert_extractive.py --workdir=workdirs/hibert_ext \\
      --config.model.hibert.init_from=workdirs/hibert
  python eval.py --workdir=workdirs/hibert_ext --config.eval.split=test

Without `init_from` the encoder starts from scratch (the paper's baseline).
"""

from configs import hibert


def get_config() -> dict:
  config = hibert.get_config()
  model = dict(config['model'], hibert={
      key: value for key, value in config['model']['hibert'].items() if key != 'decoder_layers'})
  return dict(config, task='extractive', model=model,
              optimizer={'learning_rate': 5e-4, 'warmup_steps': 50},
              train={'num_steps': 400, 'log_every': 50, 'eval_every': 200,
                     'checkpoint_every': 200})
