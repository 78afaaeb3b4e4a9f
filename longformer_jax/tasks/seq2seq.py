"""Task `seq2seq` (LED, Longformer sec. 7): an encoder-decoder maps a source to a target text.

Data: `data/seq2seq_tasks.py`: source `[b, data.seq_len]`, decoder inputs
and targets `[b, data.target_len]` (the decoder starts with `bos_id`; no
BOS is written before the source, so a tokenizer without one, T5's, serves).
Model: `models/encoder_decoder.EncoderDecoder` (`model.decoder_layers >= 1`,
`model.logits_bias`). Sums over the target tokens of real examples:
`loss_sum` (nats) over `count` tokens, `correct`, `examples`,
`aux_objective`; metrics: `loss`, `token_accuracy`, `tokens`, `examples`.
eval.py adds ROUGE-1/2/L of greedy decoding (`evaluation/greedy_decoding.py`).
Fine-tunes a Hugging Face LED (or T5).
"""

import functools

import jax.numpy as jnp

from longformer_jax.config.errors import require
from longformer_jax.data import seq2seq_tasks
from longformer_jax.evaluation.greedy_decoding import rouge_of_batches
from longformer_jax.models.encoder import encoder_context
from longformer_jax.models.encoder_decoder import EncoderDecoder, decoder_context
from longformer_jax.tasks.base import ExampleTask, token_metrics, token_sums

HF_TARGET_LEN = 128     # an imported checkpoint's config: targets of at most this many tokens


def seq2seq_sums(model, variables, batch: dict, rngs: dict, deterministic: bool) -> dict:
  """Sums of `batch` (`inputs [b, L]`, `input_mask`, `global_flags`, `decoder_inputs [b, T]`,
  `decoder_targets [b, T]`, `decoder_mask [b, T]`, `weight [b]`)."""
  source_ctx = encoder_context(batch['input_mask'], batch['global_flags'], deterministic)
  target_ctx = decoder_context(batch['decoder_mask'], deterministic)
  logits, aux = variables.apply(model, batch['inputs'], source_ctx,
                                batch['decoder_inputs'], target_ctx, rngs=rngs)
  mask = batch['decoder_mask'].astype(jnp.float32) * batch['weight'][:, None]
  return token_sums(model, logits, aux, batch['decoder_targets'], mask, batch['weight'])


class Seq2seqTask(ExampleTask):
  name = 'seq2seq'
  needs_bos = False
  hf_checkpoint = 'encoder_decoder'
  data_module = seq2seq_tasks
  model_class = EncoderDecoder
  carries_model_state = False    # report_extras decodes with the parameters alone
  data_keys = ('seq_len', 'max_examples', 'tfds_config', 'target_len')
  train_keys = ('eval_max_examples', 'init_from_hf')
  model_keys = ('decoder_layers', 'logits_bias')
  columns = (('token_accuracy', 'token accuracy'), ('rouge1', 'ROUGE-1'),
             ('rouge2', 'ROUGE-2'), ('rougeL', 'ROUGE-L'))
  extra_metrics = ('rouge1', 'rouge2', 'rougeL')

  def check_model(self, data, model: dict) -> None:
    require(model['decoder_layers'] >= 1, 'model.decoder_layers',
            f"{model['decoder_layers']} must be >= 1 for task 'seq2seq'")

  def hf_settings(self, data: dict, model: dict, settings: dict) -> None:
    """A fine-tuning config of an imported checkpoint (convert/workdir_cli.py): targets within
    its decoder's positions."""
    del model
    data['target_len'] = min(HF_TARGET_LEN, settings.get('decoder_max_positions') or HF_TARGET_LEN)

  def init_arguments(self, batch: dict) -> tuple:
    return (batch['inputs'], encoder_context(batch['input_mask'], batch['global_flags'], True),
            batch['decoder_inputs'], decoder_context(batch['decoder_mask'], True))

  def sums_fn(self, config, model):
    del config
    return functools.partial(seq2seq_sums, model)

  def metrics(self, totals: dict) -> dict:
    return token_metrics(super().metrics(totals), totals)

  def report_extras(self, config, split: str, model, params, batches, tokenizer) -> dict:
    """ROUGE-1/2/L of greedy decoding against the references."""
    del config, split
    return rouge_of_batches(model, params, batches, tokenizer)


TASK = Seq2seqTask()
