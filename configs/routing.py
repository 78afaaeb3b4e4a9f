r"""Routing Transformer (Roy et al., 2021) as a causal byte-level LM on the built-in corpus.

Within each chunk of 256 bytes (no memory): of the 4 heads, 2 are local heads
(causal window of 64 bytes) and 2 routing heads (shared query-key, online
k-means with k = 4 centroids per head, EMA decay 0.999; each query attends to
the 64 most recent earlier bytes of its own cluster: window = n / k, the
paper's balance). The centroids are model state, checkpointed with the run;
the commitment loss has weight 1e-3. The optional argument after ':' sets k
and the window n / k (e.g. `:16` gives 16 clusters, windows of 16).

  python train.py --config=configs/routing.py --workdir=workdirs/routing
  python train.py --config=configs/routing.py:16 --workdir=workdirs/routing_16
  python eval.py  --config=configs/routing.py --workdir=workdirs/routing

Data, size and budget as the other attention configs (configs/blockbert.py,
configs/performer.py): the default model, the train section's 900 steps.
"""

from longformer_jax.config.errors import require

CHUNK = 256


def get_config(arg: str = '') -> dict:
  clusters = arg.strip() or '4'
  require(clusters.isdigit() and 1 <= int(clusters) <= CHUNK, '--config',
          f'routing.py:{arg}: the argument is the number of clusters, an integer in [1, {CHUNK}]')
  k = int(clusters)
  return {'model': {
      'attention': 'routing',
      'routing': {'num_clusters': k, 'window': -(-CHUNK // k)},
      'aux_loss_weights': {'commitment_loss': 1e-3},
  }}
