"""Image Transformer local 1D attention (Parmar et al., 2018) as a byte-level LM on the built-in corpus.

Local 1D attention is defined on any sequence in generation order: query
blocks of l_q = 64 bytes attend to themselves and the l_m = 64 bytes before
them (`model.image_local`), within each chunk of 256 bytes (no memory).
Data, size and budget as configs/default.py's model (compare with
configs/vanilla.py and configs/sparse_transformer.py).

  python train.py --config=configs/image_local.py --workdir=workdirs/image_local
  python eval.py --workdir=workdirs/image_local
"""


def get_config() -> dict:
  return {
      'model': {
          'attention': 'image_local',
          'image_local': {'layout': '1d', 'query_len': 64, 'memory_len': 64},
      },
  }
