"""Builds the tiny Hugging Face checkpoints of tests/convert/test_hf_import.py (dev-only tool).

Needs `torch` and `transformers` (not project requirements; the fixtures were written with
these versions):
  pip install torch==2.13.0 transformers==5.24.0
  python tools/make_hf_fixtures.py [--out=tests/data/hf]

For each family (gpt2; llama with grouped-query attention and llama3 rope
scaling; mistral with one key/value head and linear rope scaling; qwen2 with
q/k/v biases and a tied output; longformer, a masked LM with windows of 4 and
8 tokens in its two layers and global tokens; led, the encoder-decoder
`LEDForConditionalGeneration` with the same encoder windows, two decoder
layers and a perturbed `final_logits_bias`; t5, `T5ForConditionalGeneration`
v1.0 with a ReLU feed-forward, a tied output and 8 relative position buckets
up to distance 20, so that 12 tokens reach the logarithmic buckets; t5_v11,
v1.1 with a gated-GELU feed-forward, an untied `lm_head` and an inner width
heads * d_kv = 64 != d_model; mistral_window and qwen2_window, sliding windows of
8 tokens, Mistral's in both layers and Qwen2's from `max_window_layers` = 1 on,
on inputs of 19 tokens, row 1 right-padded from position 15; llama_long and
gpt2_long, llama and gpt2 with contexts of 320 and 300 tokens, which also hold
`long_prompt_ids.npy`, a 262-token prompt, `greedy_ids.npy`, transformers'
8 greedy tokens after it, and `greedy_logits.npy`, their logits; longformer_cls and
longformer_qa, the same Longformer as `LongformerForSequenceClassification` with 3
labels and `LongformerForQuestionAnswering`, heads of std 0.2, which record the global
flags transformers picks itself and their logits, see `head_reference`; llama_yarn,
llama_dynamic and llama_longrope, llama with head_dim 16 and the RoPE scalings yarn (with
every option), dynamic NTK and longrope, whose q/k projections are scaled up so that
positions weigh on the logits, see `rope_reference`) it writes `<out>/<name>/`
holding the Hugging Face directory (`config.json`, `model.safetensors`), a
word-level `tokenizer.json` over the model's vocabulary, `input_ids.npy` and
`attention_mask.npy` `[2, 12]` (row 1 right-padded; for longformer and led
also `global_attention_mask.npy`; for led and the t5 families
`decoder_input_ids.npy` and `decoder_attention_mask.npy` `[2, 7]`, row 1
right-padded from position 5), and `logits.npy`, the float32 reference logits
`[2, 12 (led, t5: 7), vocab]` of transformers' own model.
Seeds are fixed, so a rerun writes the same files.
"""

import argparse
import os

import numpy as np
import torch
import transformers

VOCAB = 96
LENGTH = 12
WINDOW = 8
WINDOW_FAMILIES = ('mistral_window', 'qwen2_window')
WINDOW_LENGTH = 19        # longer than the window; row 1 right-padded from position 15


def family_configs() -> dict:
  common = dict(vocab_size=VOCAB, tie_word_embeddings=False)
  configs = base_configs(common)
  # Contexts longer than 256 tokens, for greedy decoding of a long prompt.
  configs['llama_long'] = transformers.LlamaConfig(
      **dict(configs['llama'].to_dict(), max_position_embeddings=320))
  configs['gpt2_long'] = transformers.GPT2Config(**dict(configs['gpt2'].to_dict(), n_positions=300))
  # The Longformer's fine-tuning heads: 3 labels, and the span head (num_labels 2).
  configs['longformer_cls'] = transformers.LongformerConfig(
      **dict(configs['longformer'].to_dict(), num_labels=3))
  configs['longformer_qa'] = transformers.LongformerConfig(**configs['longformer'].to_dict())
  configs.update(rope_configs())
  return configs


def base_configs(common: dict) -> dict:
  return {
      'gpt2': transformers.GPT2Config(
          vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
          activation_function='gelu_new', resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
          layer_norm_epsilon=1e-5),
      'llama': transformers.LlamaConfig(
          hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
          rope_theta=500000.0,
          rope_scaling=dict(rope_type='llama3', factor=8.0, low_freq_factor=1.0,
                            high_freq_factor=4.0, original_max_position_embeddings=8),
          **common),
      'mistral': transformers.MistralConfig(
          hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=1, max_position_embeddings=64, rms_norm_eps=1e-5,
          rope_theta=10000.0, sliding_window=64,
          rope_scaling=dict(rope_type='linear', factor=2.0), **common),
      'qwen2': transformers.Qwen2Config(
          hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
          rope_theta=1000000.0, vocab_size=VOCAB, tie_word_embeddings=True),
      # Sliding windows of 8 tokens, shorter than the 19 of the inputs: Mistral's in every
      # layer, Qwen2's from layer max_window_layers = 1 on (layer 0 attends to everything).
      'mistral_window': transformers.MistralConfig(
          hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
          rope_theta=10000.0, sliding_window=WINDOW, **common),
      'qwen2_window': transformers.Qwen2Config(
          hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
          rope_theta=1000000.0, vocab_size=VOCAB, tie_word_embeddings=True,
          use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
      # RoBERTa's special-token order (<s>=0, <pad>=1): positions start at pad + 1 = 2.
      'longformer': transformers.LongformerConfig(
          vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
          intermediate_size=64, attention_window=[4, 8], max_position_embeddings=40,
          type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-5),
      # The same special-token order; encoder windows 4 and 8, learned positions 0.. on both sides;
      # init_std 0.2 (not 0.02) so that the encoder's global tokens and windows reach the logits
      # through the cross-attention well past the tolerance.
      'led': transformers.LEDConfig(
          vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
          decoder_ffn_dim=64, attention_window=[4, 8], max_encoder_position_embeddings=32,
          max_decoder_position_embeddings=32, activation_function='gelu', dropout=0.0,
          attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, bos_token_id=0,
          eos_token_id=2, decoder_start_token_id=2, tie_word_embeddings=True,
          init_std=0.2),
      # SPECIAL_TOKENS order (<pad>=0, the decoder start token); bidirectional buckets: 2 exact
      # and 2 logarithmic per side, unidirectional: 4 and 4.
      't5': transformers.T5Config(
          vocab_size=VOCAB, d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
          num_decoder_layers=2, relative_attention_num_buckets=8,
          relative_attention_max_distance=20, dropout_rate=0.0, layer_norm_epsilon=1e-6,
          feed_forward_proj='relu', pad_token_id=0, eos_token_id=2, decoder_start_token_id=0,
          tie_word_embeddings=True),
      't5_v11': transformers.T5Config(
          vocab_size=VOCAB, d_model=32, d_kv=16, num_heads=4, d_ff=64, num_layers=2,
          num_decoder_layers=2, relative_attention_num_buckets=8,
          relative_attention_max_distance=20, dropout_rate=0.0, layer_norm_epsilon=1e-6,
          feed_forward_proj='gated-gelu', pad_token_id=0, eos_token_id=2,
          decoder_start_token_id=0, tie_word_embeddings=False),
  }


def rope_configs() -> dict:
  """Llama with the length-dependent RoPE scalings, inputs of ROPE_LENGTH tokens past the
  original context (16; yarn: 32)."""
  common = dict(vocab_size=VOCAB, tie_word_embeddings=False, hidden_size=32,
                intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0)
  return {
      'llama_yarn': transformers.LlamaConfig(
          max_position_embeddings=128, **common,
          rope_scaling=dict(rope_type='yarn', factor=4.0, original_max_position_embeddings=32,
                            beta_fast=16.0, beta_slow=2.0, mscale=1.0, mscale_all_dim=0.5,
                            truncate=False)),
      # transformers' dynamic threshold is max_position_embeddings itself
      'llama_dynamic': transformers.LlamaConfig(
          max_position_embeddings=16, **common,
          rope_scaling=dict(rope_type='dynamic', factor=2.0)),
      # no factor: transformers takes max_position_embeddings / 16 = 4
      'llama_longrope': transformers.LlamaConfig(
          max_position_embeddings=64, **common,
          rope_scaling=dict(rope_type='longrope', original_max_position_embeddings=16,
                            short_factor=[1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6],
                            long_factor=[1.0, 1.5, 2.0, 3.0, 4.0, 5.5, 7.0, 9.0])),
  }


ROPE_FAMILIES = ('llama_yarn', 'llama_dynamic', 'llama_longrope')
ROPE_LENGTH, ROPE_VALID = 40, (40, 30, 12)   # rows' valid tokens: past 16, past 16, within it
YARN_PROMPT = 100


def rope_reference(model, name: str, directory: str) -> None:
  """`input_ids.npy`, `attention_mask.npy` `[3, ROPE_LENGTH]` (rows right-padded after
  ROPE_VALID tokens) and `logits.npy` `[3, ROPE_LENGTH, vocab]`: each row's valid tokens
  run alone by a fresh copy of the model (dynamic NTK and longrope read the length of the
  forward, and transformers' dynamic update keeps state between calls), zeros on padding.
  llama_yarn also: `long_prompt_ids.npy` (YARN_PROMPT tokens), `greedy_ids.npy`,
  `greedy_logits.npy` (`write_greedy`). Prints how far the logits move without the scaling."""
  import copy  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(3)
  ids = rng.integers(4, VOCAB, size=(len(ROPE_VALID), ROPE_LENGTH)).astype(np.int64)
  mask = (np.arange(ROPE_LENGTH)[None, :] < np.asarray(ROPE_VALID)[:, None]).astype(np.int64)
  plain = transformers.LlamaConfig(**{**model.config.to_dict(), 'rope_parameters': None,
                                      'rope_scaling': None})
  unscaled = transformers.LlamaForCausalLM(plain).eval()
  unscaled.load_state_dict(model.state_dict())
  logits = np.zeros(ids.shape + (VOCAB,), np.float32)
  with torch.no_grad():
    for row, valid in enumerate(ROPE_VALID):
      row_ids = torch.from_numpy(ids[row:row + 1, :valid])
      logits[row, :valid] = copy.deepcopy(model)(input_ids=row_ids).logits[0].float().numpy()
      moved = np.abs(unscaled(input_ids=row_ids).logits[0].float().numpy() - logits[row, :valid])
      print(f'{name} row {row} ({valid} tokens): without the scaling the logits move by '
            f'{moved.max() / np.abs(logits[row, :valid]).max():.3g} of the largest')
  np.save(os.path.join(directory, 'input_ids.npy'), ids.astype(np.int32))
  np.save(os.path.join(directory, 'attention_mask.npy'), mask.astype(np.int32))
  np.save(os.path.join(directory, 'logits.npy'), logits)
  if name == 'llama_yarn':
    write_greedy(model, directory, YARN_PROMPT)


def model_class(name: str):
  return {'gpt2': transformers.GPT2LMHeadModel, 'llama': transformers.LlamaForCausalLM,
          'gpt2_long': transformers.GPT2LMHeadModel,
          'llama_long': transformers.LlamaForCausalLM,
          'llama_yarn': transformers.LlamaForCausalLM,
          'llama_dynamic': transformers.LlamaForCausalLM,
          'llama_longrope': transformers.LlamaForCausalLM,
          'mistral': transformers.MistralForCausalLM,
          'qwen2': transformers.Qwen2ForCausalLM,
          'mistral_window': transformers.MistralForCausalLM,
          'qwen2_window': transformers.Qwen2ForCausalLM,
          'longformer': transformers.LongformerForMaskedLM,
          'longformer_cls': transformers.LongformerForSequenceClassification,
          'longformer_qa': transformers.LongformerForQuestionAnswering,
          'led': transformers.LEDForConditionalGeneration,
          't5': transformers.T5ForConditionalGeneration,
          't5_v11': transformers.T5ForConditionalGeneration}[name]


SPECIAL_TOKENS = ('<pad>', '<s>', '</s>', '<unk>')
ROBERTA_SPECIAL_TOKENS = ('<s>', '<pad>', '</s>', '<unk>')
LONGFORMER_HEADS = ('longformer_cls', 'longformer_qa')
ROBERTA_FAMILIES = ('longformer', 'led') + LONGFORMER_HEADS
T5_FAMILIES = ('t5', 't5_v11')
DECODER_LENGTH = 7
LONG_FAMILIES = ('llama_long', 'gpt2_long')
LONG_PROMPT, GREEDY_NEW = 262, 8


def write_greedy(model, directory: str, prompt_length: int = LONG_PROMPT) -> None:
  """`long_prompt_ids.npy` [prompt_length] (BOS 1, then words) and `greedy_ids.npy`
  [GREEDY_NEW]: transformers' greedy continuation (argmax over the whole vocabulary, the
  whole text re-run at each step, no end token), and `greedy_logits.npy` [GREEDY_NEW, vocab],
  the logits each token was chosen from."""
  rng = np.random.default_rng(2)
  prompt = np.concatenate([[1], rng.integers(4, VOCAB, prompt_length - 1)]).astype(np.int64)
  ids, steps = torch.from_numpy(prompt)[None, :], []
  with torch.no_grad():
    for _ in range(GREEDY_NEW):
      steps.append(model(input_ids=ids).logits[0, -1].float().numpy())
      ids = torch.cat([ids, torch.tensor([[int(steps[-1].argmax())]])], dim=1)
  np.save(os.path.join(directory, 'long_prompt_ids.npy'), prompt.astype(np.int32))
  np.save(os.path.join(directory, 'greedy_ids.npy'),
          ids[0, prompt_length:].numpy().astype(np.int32))
  np.save(os.path.join(directory, 'greedy_logits.npy'), np.stack(steps).astype(np.float32))


def word_level_tokenizer(path: str, special_tokens: tuple = SPECIAL_TOKENS) -> None:
  """`tokenizer.json`: ids 0-3 the special tokens, then words 'w4' .. 'w{VOCAB-1}',
  split on whitespace."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  vocab = {token: i for i, token in enumerate(special_tokens)}
  vocab.update({f'w{i}': i for i in range(len(special_tokens), VOCAB)})
  tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token='<unk>'))
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tokenizer.add_special_tokens(list(special_tokens))
  tokenizer.save(path)


def model_inputs(name: str) -> dict:
  """int64 `[2, LENGTH]` inputs; row 1 right-padded from position 8.

  Longformer and LED: words only (ids >= 4; Longformer's position ids count
  non-pad tokens), pad ids in the padding, and global tokens 0 and 5 in row 0,
  0 in row 1. LED also: decoder inputs `[2, DECODER_LENGTH]`, the decoder start
  token (2) then words, row 1 right-padded from position 5.
  """
  rng = np.random.default_rng(1)
  if name in WINDOW_FAMILIES:
    mask = np.ones((2, WINDOW_LENGTH), np.int64)
    mask[1, 15:] = 0
    return dict(input_ids=rng.integers(0, VOCAB, size=(2, WINDOW_LENGTH)).astype(np.int64),
                attention_mask=mask)
  mask = np.ones((2, LENGTH), np.int64)
  mask[1, 8:] = 0
  if name in T5_FAMILIES:
    return t5_inputs(rng, mask)
  if name in LONGFORMER_HEADS:
    return head_inputs(rng, mask, name)
  if name not in ROBERTA_FAMILIES:
    return dict(input_ids=rng.integers(0, VOCAB, size=(2, LENGTH)).astype(np.int64),
                attention_mask=mask)
  input_ids = rng.integers(4, VOCAB, size=(2, LENGTH)).astype(np.int64)
  input_ids[mask == 0] = 1
  global_mask = np.zeros((2, LENGTH), np.int64)
  global_mask[:, 0] = 1
  global_mask[0, 5] = 1
  inputs = dict(input_ids=input_ids, attention_mask=mask, global_attention_mask=global_mask)
  if name == 'led':
    decoder_mask = np.ones((2, DECODER_LENGTH), np.int64)
    decoder_mask[1, 5:] = 0
    decoder_ids = rng.integers(4, VOCAB, size=(2, DECODER_LENGTH)).astype(np.int64)
    decoder_ids[:, 0] = 2
    decoder_ids[decoder_mask == 0] = 1
    inputs.update(decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask)
  return inputs


def head_inputs(rng, mask: np.ndarray, name: str) -> dict:
  """The Longformer heads' inputs, without `global_attention_mask`: transformers then flags
  token 0 (classification) or the tokens before the first separator (QA), the flags the
  fixture records (`global_attention_mask.npy`). `<s>` (0) first; QA rows are RoBERTa pairs,
  `<s> question </s></s> context </s>` with exactly three separators (2), as transformers needs."""
  input_ids = rng.integers(4, VOCAB, size=(2, LENGTH)).astype(np.int64)
  input_ids[:, 0] = 0
  if name == 'longformer_qa':
    input_ids[0, [4, 5, 11]] = 2          # question 1..3, context 6..10
    input_ids[1, [3, 4, 7]] = 2           # question 1..2, context 5..6, padded from 8
  input_ids[mask == 0] = 1
  return dict(input_ids=input_ids, attention_mask=mask)


def head_reference(model, name: str, inputs: dict, directory: str) -> None:
  """`global_attention_mask.npy` (the flags transformers chose) and the reference logits:
  `logits.npy` [2, num_labels] (classification), `start_logits.npy`, `end_logits.npy` [2, 12]
  (QA)."""
  from transformers.models.longformer import modeling_longformer  # pylint: disable=g-import-not-at-top
  ids = torch.from_numpy(inputs['input_ids'])
  if name == 'longformer_qa':
    flags = modeling_longformer._compute_global_attention_mask(ids, model.config.sep_token_id)  # pylint: disable=protected-access
  else:
    flags = torch.zeros_like(ids)
    flags[:, 0] = 1
  np.save(os.path.join(directory, 'global_attention_mask.npy'), flags.numpy().astype(np.int32))
  with torch.no_grad():
    out = model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    again = model(global_attention_mask=flags, **{k: torch.from_numpy(v) for k, v in inputs.items()})
  outputs = ('logits',) if name == 'longformer_cls' else ('start_logits', 'end_logits')
  for key in outputs:
    assert torch.equal(getattr(out, key), getattr(again, key)), f'{name}: other global flags'
    np.save(os.path.join(directory, f'{key}.npy'), getattr(out, key).float().numpy())


def t5_inputs(rng, mask: np.ndarray) -> dict:
  """T5: words (ids >= 4) with pad ids (0) in the source's padding; decoder inputs
  `[2, DECODER_LENGTH]`: the decoder start token (0), then words, row 1 right-padded from
  position 5."""
  input_ids = rng.integers(4, VOCAB, size=(2, LENGTH)).astype(np.int64)
  input_ids[mask == 0] = 0
  decoder_mask = np.ones((2, DECODER_LENGTH), np.int64)
  decoder_mask[1, 5:] = 0
  decoder_ids = rng.integers(4, VOCAB, size=(2, DECODER_LENGTH)).astype(np.int64)
  decoder_ids[:, 0] = 0
  decoder_ids[decoder_mask == 0] = 0
  return dict(input_ids=input_ids, attention_mask=mask, decoder_input_ids=decoder_ids,
              decoder_attention_mask=decoder_mask)


def untie_t5_lm_head(model, directory: str) -> None:
  """T5 v1.1 as released: `tie_word_embeddings: false` in config.json and its own
  `lm_head.weight`. transformers 5 always ties T5's output (it reads the flag as
  `scale_decoder_outputs`, and unties only when a file holds a different `lm_head`),
  so the head is untied here, then the file written as the released ones are."""
  from safetensors.torch import load_file, save_file  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight))
  tensors = load_file(os.path.join(directory, 'model.safetensors'))
  tensors['lm_head.weight'] = model.lm_head.weight.detach().clone().contiguous()
  save_file(tensors, os.path.join(directory, 'model.safetensors'), metadata={'format': 'pt'})
  path = os.path.join(directory, 'config.json')
  with open(path) as f:
    config = json.load(f)
  config.pop('scale_decoder_outputs', None)
  config['tie_word_embeddings'] = False
  with open(path, 'w') as f:
    json.dump(config, f, indent=2, sort_keys=True)


def build(name: str, config, out: str) -> None:
  torch.manual_seed(0)
  model = model_class(name)(config).eval()
  with torch.no_grad():  # random biases and norm scales, so that a missed one shows
    for param_name, param in model.named_parameters():
      if param_name.endswith('bias') or 'norm' in param_name.lower() or 'ln_' in param_name:
        param.add_(0.1 * torch.randn_like(param))
    if name in LONGFORMER_HEADS:  # std 0.2 (not 0.02): a transposed head moves the logits far
      for param_name, param in model.named_parameters():
        if param_name.startswith(('classifier.', 'qa_outputs.')) and param.dim() == 2:
          param.mul_(10.0)
    if name == 'led':  # a buffer, not a parameter; zeros unless perturbed
      model.final_logits_bias.add_(0.1 * torch.randn_like(model.final_logits_bias))
    if name in ROPE_FAMILIES:  # peaked attention: make the rotary positions weigh on the logits
      for param_name, param in model.named_parameters():
        if param_name.endswith(('q_proj.weight', 'k_proj.weight')):
          param.mul_(8.0)
    if name in T5_FAMILIES:  # ~0.18 at init: make the position bias weigh on the logits
      for param_name, param in model.named_parameters():
        if 'relative_attention_bias' in param_name:
          param.mul_(4.0)
  directory = os.path.join(out, name)
  os.makedirs(directory, exist_ok=True)
  model.save_pretrained(directory, safe_serialization=True)
  if name == 't5_v11':
    untie_t5_lm_head(model, directory)
  if name in ROPE_FAMILIES:
    rope_reference(model, name, directory)
    word_level_tokenizer(os.path.join(directory, 'tokenizer.json'))
    if os.path.exists(os.path.join(directory, 'generation_config.json')):
      os.remove(os.path.join(directory, 'generation_config.json'))
    return
  inputs = model_inputs(name)
  if name in LONGFORMER_HEADS:
    for key, value in inputs.items():
      np.save(os.path.join(directory, f'{key}.npy'), value.astype(np.int32))
    head_reference(model, name, inputs, directory)
    word_level_tokenizer(os.path.join(directory, 'tokenizer.json'), ROBERTA_SPECIAL_TOKENS)
    return
  with torch.no_grad():
    logits = model(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits
  if name in T5_FAMILIES + WINDOW_FAMILIES:  # the saved directory means the same model
    reloaded = model_class(name).from_pretrained(directory).eval()
    with torch.no_grad():
      again = reloaded(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits
    assert torch.equal(logits, again), f'{name}: the saved model computes other logits'
  for key, value in inputs.items():
    np.save(os.path.join(directory, f'{key}.npy'), value.astype(np.int32))
  np.save(os.path.join(directory, 'logits.npy'), logits.float().numpy().astype(np.float32))
  if name in LONG_FAMILIES:
    write_greedy(model, directory)
  word_level_tokenizer(os.path.join(directory, 'tokenizer.json'),
                       ROBERTA_SPECIAL_TOKENS if name in ROBERTA_FAMILIES else SPECIAL_TOKENS)
  for extra in ('generation_config.json',):
    if os.path.exists(os.path.join(directory, extra)):
      os.remove(os.path.join(directory, extra))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', default=os.path.join('tests', 'data', 'hf'))
  parser.add_argument('--only', default='', help='comma-separated families (default: all)')
  args = parser.parse_args()
  for name, config in family_configs().items():
    if args.only and name not in args.only.split(','):
      continue
    build(name, config, args.out)
    print(f'wrote {os.path.join(args.out, name)}')


if __name__ == '__main__':
  main()
