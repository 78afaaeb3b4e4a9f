"""Every field of a Hugging Face `config.json`, per `model_type`: read, inert, or refused.

A field that changes what the model computes is either read by the family's
importer (`READ`; a value it does not implement is refused there, e.g.
`rope_parameters.rope_type='proportional'`) or accepted only at the value that
leaves the function unchanged (`FIXED`). A field known not to change the
function (dropout at evaluation, initialisation, generation defaults, output
options, ids of special tokens) is `INERT`. Any other field is refused in one
line naming it, so a field that a new transformers release adds is refused
until someone has looked at it and listed it here.

`check_fields(hf)` runs before every import (loader.model_settings).
"""

from longformer_jax.convert.errors import ConversionError

# Every config (transformers' PretrainedConfig and older releases' serialised defaults).
COMMON_INERT = frozenset({
    '_name_or_path', 'architectures', 'model_type', 'transformers_version', 'dtype',
    'torch_dtype', 'use_bfloat16', 'torchscript', 'tf_legacy_loss', 'output_attentions',
    'output_hidden_states', 'return_dict', 'use_return_dict', 'chunk_size_feed_forward',
    'id2label', 'label2id', 'num_labels', 'problem_type', 'finetuning_task', 'tokenizer_class',
    'prefix', 'task_specific_params', 'gradient_checkpointing', 'use_cache', 'bos_token_id',
    'eos_token_id', 'pad_token_id', 'sep_token_id', 'decoder_start_token_id',
    'initializer_range',
    # generation defaults that older files keep in config.json (generation_config.json now)
    'max_length', 'min_length', 'do_sample', 'early_stopping', 'num_beams', 'num_beam_groups',
    'diversity_penalty', 'temperature', 'top_k', 'top_p', 'typical_p', 'repetition_penalty',
    'length_penalty', 'no_repeat_ngram_size', 'encoder_no_repeat_ngram_size', 'bad_words_ids',
    'num_return_sequences', 'output_scores', 'return_dict_in_generate', 'forced_bos_token_id',
    'forced_eos_token_id', 'remove_invalid_values', 'exponential_decay_length_penalty',
    'suppress_tokens', 'begin_suppress_tokens', 'max_new_tokens',
})

# Fields that change the function, accepted only at the value that does not.
COMMON_FIXED = {
    'pruned_heads': {}, 'tie_encoder_decoder': False, 'add_cross_attention': False,
    'cross_attention_hidden_size': None,
}

_DECODER_READ = frozenset({
    'vocab_size', 'hidden_size', 'num_attention_heads', 'num_hidden_layers', 'num_key_value_heads',
    'head_dim', 'intermediate_size', 'hidden_act', 'rms_norm_eps', 'rope_parameters', 'rope_theta',
    'rope_scaling', 'tie_word_embeddings', 'max_position_embeddings'})
_DECODER_INERT = frozenset({'attention_dropout', 'is_decoder'})

READ = {
    'gpt2': frozenset({
        'vocab_size', 'n_embd', 'n_head', 'n_inner', 'n_layer', 'n_positions',
        'activation_function', 'layer_norm_epsilon', 'scale_attn_by_inverse_layer_idx',
        'scale_attn_weights'}),
    'llama': _DECODER_READ | {'attention_bias', 'mlp_bias', 'pretraining_tp'},
    'mistral': _DECODER_READ | {'sliding_window'},
    'qwen2': _DECODER_READ | {'sliding_window', 'use_sliding_window', 'max_window_layers',
                              'layer_types'},
    'longformer': frozenset({
        'vocab_size', 'hidden_size', 'num_attention_heads', 'num_hidden_layers',
        'intermediate_size', 'hidden_act', 'layer_norm_eps', 'max_position_embeddings',
        'pad_token_id', 'type_vocab_size', 'attention_window'}),
    'led': frozenset({
        'vocab_size', 'd_model', 'encoder_layers', 'decoder_layers', 'encoder_attention_heads',
        'decoder_attention_heads', 'encoder_ffn_dim', 'decoder_ffn_dim', 'activation_function',
        'attention_window', 'max_encoder_position_embeddings',
        'max_decoder_position_embeddings', 'scale_embedding', 'tie_word_embeddings'}),
    't5': frozenset({
        'vocab_size', 'd_model', 'd_kv', 'd_ff', 'num_layers', 'num_decoder_layers', 'num_heads',
        'feed_forward_proj', 'dense_act_fn', 'layer_norm_epsilon', 'is_encoder_decoder',
        'relative_attention_num_buckets', 'relative_attention_max_distance',
        'scale_decoder_outputs', 'tie_word_embeddings'}),
}

INERT = {
    # n_ctx: older files' context size, equal to n_positions (which sizes the table);
    # reorder_and_upcast_attn: float32 attention scores, which a float32 import has anyway;
    # summary_*: the double-heads model's multiple-choice head, not the LM.
    'gpt2': frozenset({
        'attn_pdrop', 'embd_pdrop', 'resid_pdrop', 'n_ctx', 'reorder_and_upcast_attn',
        'summary_activation', 'summary_first_dropout', 'summary_proj_to_labels', 'summary_type',
        'summary_use_proj', 'is_decoder'}),
    'llama': _DECODER_INERT,
    'mistral': _DECODER_INERT,
    'qwen2': _DECODER_INERT,
    # position_embedding_type, attention_mode, ignore_attention_mask: RoBERTa's and the
    # original Longformer repository's keys, which LongformerModel does not read.
    'longformer': frozenset({
        'attention_probs_dropout_prob', 'hidden_dropout_prob', 'classifier_dropout',
        'onnx_export', 'position_embedding_type', 'attention_mode', 'ignore_attention_mask'}),
    'led': frozenset({
        'dropout', 'attention_dropout', 'activation_dropout', 'classifier_dropout',
        'encoder_layerdrop', 'decoder_layerdrop', 'init_std', 'num_hidden_layers',
        'is_encoder_decoder'}),
    # is_gated_act: derived from feed_forward_proj; n_positions, output_past: older files'.
    't5': frozenset({
        'dropout_rate', 'classifier_dropout', 'initializer_factor', 'is_gated_act',
        'n_positions', 'output_past'}),
}

FIXED = {
    # GPT-2 and Longformer: the import ties the output to the input table; an untied
    # file would get a head the file does not hold.
    'gpt2': {'tie_word_embeddings': True, 'is_encoder_decoder': False},
    'llama': {'is_encoder_decoder': False},
    'mistral': {'is_encoder_decoder': False},
    'qwen2': {'is_encoder_decoder': False},
    'longformer': {'tie_word_embeddings': True, 'is_encoder_decoder': False,
                   'is_decoder': False},
    'led': {},
    't5': {'is_decoder': False},
}


def check_fields(hf: dict) -> None:
  """Refuses (one line) a field of `hf` that is neither read nor known to be inert."""
  model_type = hf['model_type']
  if model_type not in READ:
    return          # loader.family names the unsupported model_type
  fixed = {**COMMON_FIXED, **FIXED[model_type]}
  for key in sorted(hf):
    value = hf[key]
    if key in READ[model_type] or key in INERT[model_type] or key in COMMON_INERT:
      continue
    if key in fixed:
      if value == fixed[key] or (value is None and fixed[key] in ({}, None)):
        continue
      raise ConversionError(
        f'config.json: {key}={value!r} is not supported for {model_type} (it changes '
        f'the model; only {fixed[key]!r} is implemented)')
    raise ConversionError(
      f'config.json: field {key!r} is not known for {model_type} (neither implemented '
      f'nor known to leave the model unchanged; see longformer_jax/convert/hf_fields.py)')
