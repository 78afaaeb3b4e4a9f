"""HIBERT pretraining (Zhang, Wei & Zhou, 2019, sec. 3.2): masked sentence prediction.

Task `sentence_mask` (`tasks/sentence_mask.py`): documents are the standard
library's docstrings split into sentences (`data/hibert_documents.py`), byte
level; 15% of each document's sentences are picked (80% [MASK] tokens, 10% a
random sentence, 10% unchanged) and a small decoder predicts their tokens from
the document encoder's output at their positions. Metrics: loss per masked
token and masked-token accuracy. Your own text files: `--config.data.corpus=DIR`;
CNN/DailyMail articles: `--config.data.corpus=cnn_dailymail
--config.data.tfds_data_dir=DIR` (prepared with `tfds build cnn_dailymail`).

  python train.py --config=configs/hibert.py --workdir=workdirs/hibert
  python eval.py --workdir=workdirs/hibert --config.eval.split=test

then fine-tune for extractive summarisation from its encoder: configs/hibert_extractive.py.
A few minutes on a 2-core CPU.
"""


def get_config() -> dict:
  return {
      'task': 'sentence_mask',
      'model': {'d_model': 128, 'num_heads': 4, 'head_dim': 32, 'd_ff': 512, 'dropout_rate': 0.1,
                'causal': False,
                'hibert': {'sentence_layers': 2, 'document_layers': 2, 'decoder_layers': 1,
                           'max_sentences': 16, 'max_sentence_tokens': 64}},
      'data': {'batch_size': 16, 'eval_batch_size': 16},
      'optimizer': {'learning_rate': 1e-3, 'warmup_steps': 50},
      'train': {'num_steps': 600, 'log_every': 50, 'eval_every': 300, 'checkpoint_every': 300},
  }
