"""Exact memory-carrying generation (generation/chunk_window_decoder.py), refusals, streaming text.

The decoder's logits, token by token over a prompt longer than two chunks
and the tokens generated after it, equal a chunked forward over the whole
sequence, computed here by a plain Python loop over its chunks (padding
invalid), for the memory variants that generate. Every registered variant
is probed (slow): the refused ones do change earlier outputs when later
tokens of the chunk change, the accepted ones do not.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.context import MODEL_STATE, AttentionContext
from longformer_jax.attention.registry import ATTENTION_VARIANTS
from longformer_jax.config.errors import ConfigError
from longformer_jax.data.byte_tokenizer import ByteTokenizer
from longformer_jax.data.sentencepiece_tokenizer import SentencePieceTokenizer, train_sentencepiece
from longformer_jax.generation.chunk_window_decoder import ChunkWindowDecoder, chunk_context
from longformer_jax.generation.generation_checks import check_can_generate, refusal
from longformer_jax.generation.sampling import SamplingSettings
from longformer_jax.generation.streaming_text import StreamingText
from longformer_jax.generation.text_generation import (END_OF_DOCUMENT, MAX_NEW_TOKENS,
                                                       STOP_STRING, generate_text)
from longformer_jax.models.decoder_lm import DecoderLM
from tests.support.tiny_models import tiny_config, tiny_model_config

C = 16                       # chunk length
PAD = ByteTokenizer.pad_id
PROMPT_LEN = 3 * C + 5       # BOS + 52 tokens: a scan of 2 chunks, one chunk step, a partial chunk
NEW_TOKENS = 2 * C - 5       # ends exactly at a chunk boundary
# Tiny programs: compile fast rather than run fast (as tests/support/fast_compile.py).
FAST_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True}

# Generating variants: one layer, d_model 32, memory 16-32 tokens.
GENERATING = {
    'vanilla': dict(),
    'xl': dict(mem_len=16),
    'compressive': dict(mem_len=16, compressive={'compressed_mem_len': 16, 'rate': 2}),
    'attendre': dict(attendre={'memory_size': 24, 'policy': 'lra_max', 'top_k': 4}),
    'memorizing': dict(mem_len=16, memorizing={'memory_size': 32, 'top_k': 4}),
    'streaming_sinks': dict(streaming_sinks={'num_sinks': 2, 'window': 12}),
}


def model_config(name: str, num_layers: int = 1, **overrides):
  settings = dict(GENERATING.get(name, {}), **overrides)
  return tiny_model_config(attention=name, num_layers=num_layers, **settings)


def initial_variables(config) -> dict:
  """Random parameters (and model state, if the model has any) of a `DecoderLM`."""
  tokens = jnp.full((1, C), 65, jnp.int32)
  ctx = AttentionContext(positions=jnp.arange(C)[None], segment_ids=jnp.zeros((1, C), jnp.int32),
                         reset=jnp.ones((1,), bool), valid=jnp.ones((1, C), bool))
  init = jax.jit(DecoderLM(config).init, compiler_options=FAST_COMPILE)
  return dict(init(jax.random.PRNGKey(1), tokens, DecoderLM.init_state(config, 1), ctx))


def chunked_forward_logits(config, variables, tokens: np.ndarray) -> np.ndarray:
  """float32 `[n, vocab]`: the model over `[n]` tokens, chunk after chunk with the memory
  carried, the last chunk padded with invalid positions (a Python loop, no decoder code)."""
  n = tokens.size
  padded = np.full(-(-n // C) * C, PAD, np.int32)
  padded[:n] = tokens
  apply = jax.jit(lambda v, t, s, ctx: DecoderLM(config).apply(v, t, s, ctx)[:2],
                  compiler_options=FAST_COMPILE)
  memory, outputs = DecoderLM.init_state(config, 1), []
  for start in range(0, padded.size, C):
    positions = np.arange(start, start + C, dtype=np.int32)
    ctx = AttentionContext(positions=jnp.asarray(positions[None]),
                           segment_ids=jnp.zeros((1, C), jnp.int32),
                           reset=jnp.asarray([start == 0]),
                           valid=jnp.asarray((positions < n)[None]), deterministic=True)
    logits, memory = apply(variables, jnp.asarray(padded[None, start:start + C]), memory, ctx)
    outputs.append(np.asarray(logits[0]))
  return np.concatenate(outputs)[:n]


def decoder_of(config, variables, chunks_per_call: int = 1) -> ChunkWindowDecoder:
  return ChunkWindowDecoder(config, variables['params'], chunk_len=C, pad_id=PAD,
                            model_state=variables.get(MODEL_STATE),
                            chunks_per_call=chunks_per_call, compiler_options=FAST_COMPILE)


def prompt_tokens(seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return np.concatenate([[ByteTokenizer.bos_id], rng.integers(32, 127, PROMPT_LEN - 1)])


@pytest.mark.parametrize('name', sorted(GENERATING))
def test_step_by_step_logits_equal_the_chunked_full_forward(name):
  """The prompt goes through the chunk driver's scan (2 chunks a call) for xl and attendre,
  through the chunk step alone for the others."""
  config = model_config(name)
  variables = initial_variables(config)
  decoder = decoder_of(config, variables, chunks_per_call=2 if name in ('xl', 'attendre') else 1)
  tokens = list(prompt_tokens())
  state = decoder.start(np.asarray(tokens))
  step_logits = [np.asarray(state.logits)]
  for _ in range(NEW_TOKENS):
    token = int(np.argmax(step_logits[-1][:256]))          # greedy over the bytes
    tokens.append(token)
    state = decoder.append(state, token)
    step_logits.append(np.asarray(state.logits))
  assert state.filled == 0 and state.chunk_start == PROMPT_LEN + NEW_TOKENS
  reference = chunked_forward_logits(config, variables, np.asarray(tokens))
  np.testing.assert_allclose(np.stack(step_logits), reference[PROMPT_LEN - 1:], atol=1e-5,
                             rtol=0)


def test_the_partial_chunk_is_padded_with_invalid_positions_that_keep_counting():
  ctx = chunk_context(jnp.arange(32, 32 + C)[None], 5)
  np.testing.assert_array_equal(np.asarray(ctx.valid[0]), np.arange(C) < 5)
  np.testing.assert_array_equal(np.asarray(ctx.positions[0]), np.arange(32, 32 + C))
  assert not bool(ctx.reset[0]) and ctx.deterministic
  assert bool(chunk_context(jnp.arange(C)[None], 1).reset[0])     # the document's first chunk


# ------------------------------------------------------------ the generation loop


@pytest.fixture(scope='module')
def xl_decoder():
  config = model_config('xl')
  return decoder_of(config, initial_variables(config))


def generate(decoder, prompt='The memory of the stream carries far. ' * 2, **options):
  options = dict(dict(settings=SamplingSettings(temperature=0.0), max_new_tokens=20), **options)
  pieces = []
  result = generate_text(decoder, ByteTokenizer(), prompt, write=pieces.append, **options)
  assert ''.join(pieces) == result.text
  return result


def test_greedy_output_is_deterministic_and_a_seed_reproduces_a_sample(xl_decoder):
  greedy = generate(xl_decoder)
  assert greedy.finish_reason in (MAX_NEW_TOKENS, END_OF_DOCUMENT)
  assert generate(xl_decoder).token_ids == greedy.token_ids
  sampled = SamplingSettings(temperature=1.5, top_k=50, top_p=0.95)
  first = generate(xl_decoder, settings=sampled, seed=3)
  assert generate(xl_decoder, settings=sampled, seed=3).token_ids == first.token_ids
  assert generate(xl_decoder, settings=sampled, seed=4).token_ids != first.token_ids
  assert all(t < ByteTokenizer.vocab_size and t != PAD for t in first.token_ids)


def test_generation_stops_at_a_stop_string_without_printing_it(xl_decoder):
  sampled = SamplingSettings(temperature=1.0)
  full = generate(xl_decoder, settings=sampled, seed=1)
  assert len(full.token_ids) == 20
  start = next(i for i in range(2, len(full.text) - 1) if '\ufffd' not in full.text[i:i + 2])
  stop = full.text[start:start + 2]
  stopped = generate(xl_decoder, settings=sampled, seed=1, stops=[stop])
  assert stopped.finish_reason == STOP_STRING
  assert stopped.text == full.text[:full.text.find(stop)]


# ------------------------------------------------------------ refusals


@pytest.mark.parametrize('overrides,key,reason', [
    (dict(attention='lsh', lsh={'chunk_len': 4, 'num_buckets': 4}), 'model.attention',
     'where the (bucket, position) sort cuts'),
    (dict(attention='attendre', attendre={'order': 'insert_first'}), 'model.attendre.order',
     'later tokens of a chunk evict keys'),
    (dict(attention='attendre', stack='attendre_delay',
          attendre={'memory_size': 12, 'q_memory_size': 2}), 'model.attendre.q_memory_size',
     'delayed queries'),
    (dict(attention='xl', layer_schedule={'attention': 'xl,lsh'}, scan_layers=False,
          lsh={'chunk_len': 4, 'num_buckets': 4}), 'model.attention', 'layer 1: '),
])
def test_models_that_cannot_generate_are_refused_naming_the_reason(overrides, key, reason):
  config = tiny_config(**overrides)
  with pytest.raises(ConfigError, match='cannot generate|generation needs') as error:
    check_can_generate(config)
  assert error.value.key == key and reason in str(error.value)
  assert '\n' not in str(error.value)


def test_bidirectional_models_and_encoder_tasks_are_refused():
  config = tiny_config(attention='xl')
  assert refusal(config) is None
  config.model.causal = False
  assert refusal(config)[0] == 'model.causal' and 'bidirectional' in refusal(config)[1]
  config.model.causal = True
  for task in ('qa', 'classification', 'image'):
    config.task = task
    assert refusal(config)[0] == 'task' and 'next-token head' in refusal(config)[1]


# Settings that make a tiny instance valid and its memory overflow within two chunks.
PROBE = {
    'adaptive_span': dict(mem_len=16, adaptive_span={'ramp': 4.0, 'block': 8, 'init': 0.5}),
    'attendre': dict(attendre={'memory_size': 12, 'policy': 'lra_max', 'top_k': 4}),
    'bigbird': dict(bigbird={'block': 2, 'random_blocks': 1, 'max_global_tokens': 2}),
    'compressive': dict(mem_len=8, compressive={'compressed_mem_len': 8, 'rate': 2}),
    'expire_span': dict(mem_len=16, expire_span={'ramp': 4, 'max_span': 16}),
    'longformer': dict(longformer={'window': 3, 'global_tokens': 2}),
    'lsh': dict(lsh={'chunk_len': 4, 'num_buckets': 4}),
    'memorizing': dict(mem_len=8, memorizing={'memory_size': 16, 'top_k': 4}),
    'performer': dict(performer={'block_len': 4, 'num_features': 16}),
    'routing': dict(routing={'num_clusters': 2, 'window': 3, 'local_window': 3,
                             'local_heads': 1}),
    'sparse_transformer': dict(sparse_transformer={'stride': 4}),
    'streaming_sinks': dict(streaming_sinks={'num_sinks': 2, 'window': 5}),
    'xl': dict(mem_len=8),
}
PROBE_CASES = [pytest.param(name, {}, id=name) for name in sorted(ATTENTION_VARIANTS)] + [
    pytest.param('attendre', {'attendre': {'memory_size': 12, 'order': 'insert_first'}},
                 id='attendre-insert_first')]


@pytest.mark.slow
@pytest.mark.parametrize('name,extra', PROBE_CASES)
def test_refused_variants_are_exactly_those_whose_later_tokens_change_earlier_outputs(name, extra):
  settings = dict(PROBE.get(name, {}), **extra)
  config = tiny_config(attention=name, **settings)
  frozen = model_config(name, num_layers=2, **settings)
  variables = initial_variables(frozen)
  tokens = np.concatenate([[ByteTokenizer.bos_id],
                           np.random.default_rng(0).integers(0, 256, 2 * C)]).astype(np.int32)
  reference = chunked_forward_logits(frozen, variables, tokens)
  decoder = decoder_of(frozen, variables)
  changed = False
  for t in range(C, 2 * C):                   # the second chunk cut after position t
    partial = decoder.start(tokens[:t + 1])
    changed |= not np.allclose(np.asarray(partial.logits), reference[t], atol=1e-5, rtol=0)
  assert changed == (refusal(config) is not None), refusal(config)


# ------------------------------------------------------------ streaming text


def pushed(tokenizer, ids, stops=()):
  text = StreamingText(tokenizer, stops)
  pieces = [text.push(i) for i in ids]
  return pieces, text.finish(), text


def test_incomplete_utf8_is_held_back_until_complete():
  data = 'héllo € 𝄞!'.encode()
  pieces, tail, text = pushed(ByteTokenizer(), list(data))
  assert ''.join(pieces) + tail == 'héllo € 𝄞!' and tail == ''
  assert all('\ufffd' not in piece for piece in pieces)
  assert pieces[data.index('€'.encode()):data.index('€'.encode()) + 3] == ['', '', '€']


def test_invalid_bytes_are_replaced_and_an_unfinished_sequence_at_the_end():
  pieces, tail, _ = pushed(ByteTokenizer(), [97, 0xFF, 98] + list('€'.encode()[:2]))
  assert ''.join(pieces) == 'a\ufffdb' and tail == '\ufffd'
  assert ''.join(pieces) + tail == ByteTokenizer().decode([97, 0xFF, 98, 0xE2, 0x82])


def test_stop_strings_end_the_text_unprinted_and_partial_matches_are_released():
  ids = list(b'ab\ncd\n\nef')
  pieces, tail, text = pushed(ByteTokenizer(), ids, stops=['\n\n'])
  assert ''.join(pieces) + tail == 'ab\ncd' and text.stopped
  assert pieces[2] == '' and pieces[3] == '\nc'             # '\n' held until it was no stop
  pieces, tail, text = pushed(ByteTokenizer(), list(b'abc\n'), stops=['\n\n', 'zz'])
  assert ''.join(pieces) == 'abc' and tail == '\n' and not text.stopped
  pieces, _, _ = pushed(ByteTokenizer(), list(b'xxSTOPyy'), stops=['STOP', 'OP'])
  assert ''.join(pieces) == 'xx'                              # the earliest stop wins


def test_sentencepiece_byte_pieces_are_held_until_their_character_is_complete(tmp_path):
  # Trained on ASCII only: every non-ASCII character below is spelled in byte pieces.
  documents = [f'def f{i}(x):\n    return x + {i}  # note {i}\n'.encode() for i in range(60)]
  tokenizer = SentencePieceTokenizer.load(train_sentencepiece(
      documents, str(tmp_path / 'ascii'), vocab_size=320, num_threads=1))
  text = 'def f(x):\n    return "héllo € 𝄞"  # 漢字\n'
  ids = tokenizer.encode(text)
  processor = tokenizer._processor  # pylint: disable=protected-access
  assert sum(processor.IsByte(int(i)) for i in ids) >= 4 * 2 + 2     # 𝄞, 漢, 字 and é in bytes
  pieces, tail, _ = pushed(tokenizer, ids)
  assert ''.join(pieces) + tail == text == tokenizer.decode(ids)
  assert all('\ufffd' not in piece for piece in pieces)
  pieces, tail, stopped = pushed(tokenizer, ids, stops=['# 漢'])
  assert ''.join(pieces) + tail == 'def f(x):\n    return "héllo € 𝄞"  ' and stopped.stopped
