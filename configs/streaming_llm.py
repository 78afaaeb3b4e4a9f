"""StreamingLLM attention sinks (Xiao et al., 2023) on the built-in corpus.

Every layer attends to the first 4 tokens of the document (the sinks) and
its 256 most recent tokens (itself included), with RoPE positions counted
inside that cache as in the paper: the defaults of `model.streaming_sinks`
(`num_sinks` 4, `window` 256, `positions='cache'`; 'original' uses the text
positions). Same model size and budget as configs/default.py.

  python train.py --config=configs/streaming_llm.py --workdir=workdirs/streaming_llm

Evaluation-time sinks for a model trained with configs/vanilla.py (the layer
has exactly vanilla's parameters; `memory_size` M gives
`window = chunk + M - num_sinks`, longformer_jax/evaluation/memory_sweep.py):
  python eval.py --workdir=workdirs/vanilla \
      --config.eval.memory_sweep='variant=streaming_sinks;policy=sink;memory_size=128,512;num_sinks=4'
"""

from configs import default
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(default.model_config(), {
      'model': {
          'attention': 'streaming_sinks',
          'mem_len': 0,                  # the layer keeps its own cache (sinks and window)
      },
  })
