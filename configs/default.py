"""Default: a small Transformer-XL byte-level LM on the built-in corpus.

Sized so that `python train.py` (no flags) finishes in about 10 minutes on a
2-core CPU; see README for the measured result.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = 'lm'                      # lm | classification | qa | seq2seq (encoder tasks: configs/longformer_*.py, led.py)

  # ---- data -----------------------------------------------------------
  c.data = ml_collections.ConfigDict()
  c.data.corpus = 'stdlib'           # stdlib | tiny_shakespeare | pg19
  c.data.tfds_data_dir = ''          # required for tfds corpora
  c.data.tokenizer = 'byte'          # byte | sentencepiece
  c.data.sentencepiece_model = ''    # path to a .model file
  c.data.skip_undecodable = False    # skip (with a warning) documents the tokenizer rejects
  c.data.batch_size = 8              # global number of streams (rows)
  c.data.chunk_len = 256             # tokens per chunk (segment length)
  c.data.chunks_per_step = 1         # chunks scanned (and backpropagated) per step
  c.data.eval_batch_size = 8

  # ---- model ----------------------------------------------------------
  c.model = ml_collections.ConfigDict()
  c.model.attention = 'xl'           # any name in longformer_jax/attention/registry.py
  c.model.num_layers = 4
  c.model.d_model = 256
  c.model.num_heads = 4
  c.model.head_dim = 64
  c.model.d_ff = 1024
  c.model.dropout_rate = 0.0
  c.model.tie_embeddings = True
  c.model.dtype = 'float32'          # compute dtype: float32 | bfloat16
  c.model.vocab_multiple = 64        # vocabulary padded to a multiple of this
  c.model.mem_len = 128              # XL memory length used in training
  c.model.clamp_len = -1             # XL: clamp relative distances (-1: off)
  c.model.scan_layers = False        # nn.scan over identical layers
  c.model.remat_policy = 'none'      # see longformer_jax/parallel/remat.py
  c.model.block = 'pre_ln'           # residual block type: longformer_jax/models/block_registry.py
  c.model.stack = 'standard'         # layer stack type: longformer_jax/models/stack_registry.py
  # Per-layer values, key -> one value per layer ('64,64,128,256'); see
  # longformer_jax/models/layer_schedule.py. Needs scan_layers=False.
  c.model.layer_schedule = ml_collections.ConfigDict()
  # Auxiliary loss name (a variant's aux key ending in _loss) -> weight.
  c.model.aux_loss_weights = ml_collections.ConfigDict()

  # ---- optimizer ------------------------------------------------------
  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.learning_rate = 2e-3
  c.optimizer.warmup_steps = 100
  c.optimizer.end_learning_rate_fraction = 0.1
  c.optimizer.weight_decay = 0.01
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.98
  c.optimizer.eps = 1e-8
  c.optimizer.grad_clip_norm = 1.0
  c.optimizer.grad_accum_steps = 1   # micro-batches (over batch rows) per update

  # ---- training loop --------------------------------------------------
  c.train = ml_collections.ConfigDict()
  c.train.num_steps = 900            # length of the schedule
  c.train.stop_after_steps = 0       # > 0: stop (and save) after this step; resume later
  c.train.log_every = 25
  c.train.eval_every = 300
  c.train.eval_max_tokens = 65536    # per periodic evaluation (0: whole split)
  c.train.checkpoint_every = 300
  c.train.keep_checkpoints = 3
  c.train.async_checkpointing = True
  # Phased training (Longformer, sec. 4.2): each phase multiplies the chunk length and the
  # window by these factors and the learning rate by phase_lr_factor.
  c.train.phases = 1
  c.train.phase_steps = ''           # comma list adding up to num_steps; '' = equal phases
  c.train.phase_length_factor = 2
  c.train.phase_window_factor = 2
  c.train.phase_lr_factor = 0.5

  # ---- parallelism ----------------------------------------------------
  c.parallel = ml_collections.ConfigDict()
  c.parallel.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor); -1 fills
  c.parallel.multi_host = False       # call jax.distributed.initialize()
  c.parallel.logical_axis_rules = (
      ('batch', ('data', 'fsdp')),
      ('embed', 'fsdp'),
      ('heads', 'tensor'),
      ('mlp', 'tensor'),
      ('vocab', 'tensor'),
      ('head_dim', None),
      ('length', None),
      ('memory', None),
      ('layers', None),
  )

  # ---- evaluation (eval.py) ------------------------------------------
  c.eval = ml_collections.ConfigDict()
  c.eval.split = 'valid'             # valid | test
  c.eval.chunk_len = 0               # 0: the training chunk_len
  c.eval.mem_lens = ''               # comma list, e.g. '0,128,512'; '' = training mem_len
  c.eval.max_tokens = 0              # 0: the whole split
  c.eval.step = -1                   # -1: latest checkpoint
  # Eval-time memory sweep, e.g. 'variant=attendre;policy=fifo,lra_max;memory_size=128,512'
  # (longformer_jax/evaluation/memory_sweep.py); '' = off.
  c.eval.memory_sweep = ''
  # > 0: also score the far recurrences alone, the targets whose bigram last
  # occurred more than this many tokens back in the document
  # (longformer_jax/data/far_recurrences.py): `far_bits_per_byte`. 0 = off.
  c.eval.far_distance = 0
  return c
