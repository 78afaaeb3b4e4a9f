"""Longformer character-level LM (Beltagy et al., 2020, sec. 4) on the built-in corpus.

As in the paper's LM setup: windows grow with depth (small windows low,
larger high), dilation on 2 heads of the top layer only, and the phased
training schedule of sec. 4.2: 3 phases of 300 steps, each doubling the
sequence length (`train.phase_length_factor` = 2: chunks of 128, 256, 512)
and the window (`phase_window_factor` = 2), and halving the learning rate
(`phase_lr_factor` = 0.5). Windows are one-sided and the phase-0 values:
phase p multiplies them by 2**p. Causal (the shared `model.causal`), with
each layer's window cache (`model.longformer.window_cache`); no global
tokens in LM training.

  python train.py --config=configs/longformer_lm.py --workdir=workdirs/longformer_lm
"""


def get_config() -> dict:
  return {
      'model': {
          'attention': 'longformer',
          'layer_schedule': {'longformer': {
              'window': '16,32,64,128',       # one-sided window of each layer (phase 0)
              'head_dilations': ('1,1,1,1', '1,1,1,1', '1,1,1,1', '1,1,2,2'),  # per layer, per head
          }},
      },
      'data': {'chunk_len': 128},             # phase 0; phases: 128, 256, 512
      'train': {'phases': 3},                 # 900 steps: 300 per phase
  }
