"""Longformer character-level LM (Beltagy et al., 2020, sec. 4) on the built-in corpus.

As in the paper's LM setup: windows grow with depth (small windows low,
larger high), dilation on 2 heads of the top layer only, and the phased
training schedule of sec. 4.2 (each phase doubles the sequence length and
the window and halves the learning rate). Windows are one-sided and the
phase-0 values: phase p multiplies them by 2**p.

  python train.py --config=configs/longformer_lm.py --workdir=workdirs/longformer_lm
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  c = default.get_config()
  c.model.attention = 'longformer'
  c.model.causal = True
  c.model.window = 32                # one-sided; overridden per layer below
  c.model.dilation = 1
  c.model.head_dilations = '1,1,1,1'  # per head; overridden per layer below
  c.model.global_projections = False  # no global tokens in LM training
  c.model.layer_schedule.window = '16,32,64,128'
  c.model.layer_schedule.head_dilations = ('1,1,1,1', '1,1,1,1', '1,1,1,1', '1,1,2,2')

  c.data.chunk_len = 128             # phase 0; phases: 128, 256, 512
  c.data.chunks_per_step = 1

  c.train.num_steps = 900
  c.train.phases = 3
  c.train.phase_steps = '300,300,300'
  c.train.phase_length_factor = 2    # chunk_len x2 per phase
  c.train.phase_window_factor = 2    # windows x2 per phase
  c.train.phase_lr_factor = 0.5      # learning rate x0.5 per phase
  return c
