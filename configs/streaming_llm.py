"""StreamingLLM attention sinks (Xiao et al., 2023) on the built-in corpus.

Every layer attends to the first 4 tokens of the document (the sinks) and
its 256 most recent tokens (itself included), with RoPE positions counted
inside that cache as in the paper. Same model size and budget as
configs/default.py.

  python train.py --config=configs/streaming_llm.py --workdir=workdirs/streaming_llm

Evaluation-time sinks for a model trained with configs/vanilla.py (the layer
has exactly vanilla's parameters; `memory_size` M gives
`sink_window = chunk + M - num_sinks`, longformer_jax/evaluation/memory_sweep.py):
  python eval.py --workdir=workdirs/vanilla \
      --config.eval.memory_sweep='variant=streaming_sinks;policy=sink;memory_size=128,512;num_sinks=4'
"""

from configs import default


def get_config():
  config = default.get_config()
  config.model.attention = 'streaming_sinks'
  config.model.mem_len = 0                  # unused by this layer
  config.model.num_sinks = 4                # first tokens of the document kept
  config.model.sink_window = 256            # most recent tokens seen by each query (itself included)
  config.model.sink_positions = 'cache'     # cache (slots in the cache, the paper) | original
  return config
