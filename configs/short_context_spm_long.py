"""configs/short_context_spm.py trained 10,000 steps instead of 3,000.

At 3,000 steps (12M tokens) the subword model uses only about the last 380
tokens (FIFO is best with 256 entries beside a 128-token chunk; docs/results.md,
"Eval-time memories and eviction policies"), and between steps 2,000 and 3,000 that reach was
still growing (FIFO 256 first beat FIFO 128 there). This run asks whether a
longer-trained model uses enough context for Attendre's chunk-128 setting
(memories of 128-512 entries) to separate the eviction policies. (At step
5,527 it gains 0.22 bits/byte from a FIFO memory of 256, yet FIFO still beats
LRA and LFA at every size on all targets. On the far recurrences alone,
`eval.far_distance=640`, LRA and LFA with `admission=score` and a recent
window of 16 beat FIFO and sinks of the same size at 512 entries on the
validation split in two runs, and close 56% / 84% of the gap to FIFO 2,048;
at 128-256 entries the two runs disagree. On the finished run, step 10,000,
only LFA-0 still beats FIFO and sinks there, at 512 entries, and the scored
rows lose at 128-256: docs/eval_time_memory.md, section 0.) On
two CPU cores it takes 3-5.5 hours (1.2-2 s per step);
`train.stop_after_steps` splits it:

  python train.py --config=configs/short_context_spm_long.py \\
      --workdir=runs/short_context_spm_long --config.train.stop_after_steps=3000
  (the same command without stop_after_steps resumes and finishes)
"""

from configs import short_context_spm
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(short_context_spm.get_config(), {
      'train': {'num_steps': 10000,
                'eval_every': 2000},     # checkpoints every 500 steps, as short_context_spm
  })
