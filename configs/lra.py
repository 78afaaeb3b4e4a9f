r"""The Long Range Arena (Tay et al., 2020): one config per task, attention variant and scale.

  python train.py --config=configs/lra.py:TASK,VARIANT[,SCALE] --workdir=W
  python eval.py  --config=configs/lra.py:TASK,VARIANT[,SCALE] --workdir=W --config.eval.split=test

TASK (data generated here, docs/lra.md):
  listops      ListOps trees, 10 classes, [CLS] pooling (data/lra/listops.py)
  pathfinder   Pathfinder images, pixels as tokens, mean pooling (data/lra/pathfinder.py)
  text         two excerpts of the standard library: the same kind of file or not, bytes,
               [CLS] pooling (data/lra/text_classification.py; replaces IMDb)
  retrieval    two documents: do they cite the same module, two towers, [CLS] pooling
               (data/lra/document_matching.py; replaces AAN)

VARIANT: the encoder's attention (VARIANTS below): vanilla, local (Longformer's window
without a global token), longformer (window + global [CLS]), bigbird, sparse_strided,
sparse_fixed, reformer (LSH), performer, performer_relu, routing, etc, blockbert,
bp_transformer, and image_local_2d (pathfinder only).

SCALE:
  mini (default)  2 CPU cores: 2 layers, d_model 64, 2 heads of 32, lengths still at least
                  8x the local window (33 keys); the smallest budget at which vanilla clearly
                  learns each task (docs/lra.md measures it)
  full            LRA's shapes, lengths and steps from its repository's configs
                  (google-research/long-range-arena, lra_benchmarks/*/configs/*base*.py):
                  for a GPU or TPU

The data have their own seed (`data.<task>.seed`), so `--config.seed=N` changes the
model's initialisation and batch order, never the data: every seed is tested on the same
2,000 generated test examples.
"""

from longformer_jax.config.errors import require
from longformer_jax.config.overrides import merged

TASKS = ('listops', 'pathfinder', 'text', 'retrieval')
SCALES = ('mini', 'full')

# Per scale: the model, the optimizer, and each task's data and training budget.
MODEL = {
    'mini': {'num_layers': 2, 'd_model': 64, 'num_heads': 2, 'head_dim': 32, 'd_ff': 128},
    # LRA's ListOps / Text / Retrieval / Pathfinder transformer_base shapes.
    'full': {},
}
FULL_MODEL = {
    'listops': {'num_layers': 6, 'd_model': 512, 'num_heads': 8, 'head_dim': 64, 'd_ff': 2048},
    'text': {'num_layers': 4, 'd_model': 256, 'num_heads': 4, 'head_dim': 64, 'd_ff': 1024},
    'retrieval': {'num_layers': 4, 'd_model': 128, 'num_heads': 4, 'head_dim': 32, 'd_ff': 512},
    'pathfinder': {'num_layers': 1, 'd_model': 128, 'num_heads': 4, 'head_dim': 16, 'd_ff': 128,
                   'dropout_rate': 0.2},
}
# The sequence each task's encoder reads (tokens per document, [CLS] included): a multiple of
# the blocks of every blocked variant; the content fits whole (ListOps: trees shorter than
# max_length; Text and Retrieval: max_bytes < it; Pathfinder: [CLS] + 1,024 pixels, padded).
LENGTH = {
    'mini': {'listops': 512, 'pathfinder': 1056, 'text': 1024, 'retrieval': 512},
    'full': {'listops': 2048, 'pathfinder': 1088, 'text': 4096, 'retrieval': 4096},
}
DATA = {
    'mini': {
        'listops': {'listops': {'min_length': 250, 'max_length': 500,
                                'train_examples': 48_000}},
        'pathfinder': {'pathfinder': {'dashes_per_path': 6, 'train_examples': 48_000}},
        'text': {'lra_text': {'min_bytes': 768, 'max_bytes': 1023, 'train_examples': 48_000}},
        'retrieval': {'lra_retrieval': {'min_bytes': 384, 'max_bytes': 511,
                                        'train_examples': 48_000}},
    },
    'full': {
        'listops': {},                               # LRA's: 500-2,000 tokens, 96,000 trees
        'pathfinder': {'pathfinder': {'dashes_per_path': 14}},   # the hard set, 160,000
        'text': {'lra_text': {'max_bytes': 4095}},   # 1-4K bytes, 25,000 documents
        'retrieval': {'lra_retrieval': {'max_bytes': 4095}},   # 1-4K bytes each, 147,086 pairs
    },
}
TRAIN = {
    'mini': {
        'listops': {'batch_size': 32, 'steps': 1500, 'learning_rate': 1e-3, 'warmup': 100},
        'pathfinder': {'batch_size': 32, 'steps': 1500, 'learning_rate': 1e-3, 'warmup': 100},
        'text': {'batch_size': 32, 'steps': 1500, 'learning_rate': 1e-3, 'warmup': 100},
        'retrieval': {'batch_size': 32, 'steps': 1500, 'learning_rate': 1e-3, 'warmup': 100},
    },
    # LRA's batch sizes and steps; its peak learning rates (0.05 x rsqrt(warmup) under its
    # 'constant * linear_warmup * rsqrt_decay', 1e-3 under Pathfinder's cosine) with this
    # project's AdamW warm-up and cosine decay (train/optimizer.py).
    'full': {
        'listops': {'batch_size': 32, 'steps': 5000, 'learning_rate': 1.6e-3, 'warmup': 1000,
                    'weight_decay': 0.1},
        'pathfinder': {'batch_size': 512, 'steps': 62_500, 'learning_rate': 1e-3,
                       'warmup': 312, 'weight_decay': 0.0},
        'text': {'batch_size': 32, 'steps': 20_000, 'learning_rate': 5.6e-4, 'warmup': 8000,
                 'weight_decay': 0.1},
        'retrieval': {'batch_size': 32, 'steps': 5000, 'learning_rate': 5.6e-4, 'warmup': 1000,
                      'weight_decay': 0.1},
    },
}


ROUTING_WINDOW = 64


def window(scale: str) -> int:
  """The one-sided local window w (2w + 1 keys) of the window variants at `scale`."""
  return 16 if scale == 'mini' else 128


def variants(task: str, scale: str, length: int = 0) -> dict:
  """`{variant: model settings}` for `task` at `scale` (the encoder's attention) on sequences
  of `length` tokens (0: the task's)."""
  w = window(scale)
  block = 16 if scale == 'mini' else 64
  length = length or LENGTH[scale][task]
  out = {
      'vanilla': {'attention': 'vanilla'},
      'local': {'attention': 'longformer', 'longformer': {'window': w}},
      'longformer': {'attention': 'longformer', 'longformer': {'window': w}},
      'bigbird': {'attention': 'bigbird',
                  'bigbird': {'block': block, 'window_blocks': 1, 'random_blocks': 2,
                              'global_blocks': 1}},
      'sparse_strided': {'attention': 'sparse_transformer',
                         'sparse_transformer': {'pattern': 'strided', 'stride': block * 2}},
      'sparse_fixed': {'attention': 'sparse_transformer',
                       'sparse_transformer': {'pattern': 'fixed', 'stride': block * 2,
                                              'summary_len': 2}},
      'reformer': {'attention': 'lsh',
                   'lsh': {'num_hashes': 2, 'num_buckets': 8, 'chunk_len': 32 if scale == 'mini' else 64}},
      'performer': {'attention': 'performer', 'performer': {'num_features': 128}},
      'performer_relu': {'attention': 'performer',
                         'performer': {'num_features': 128, 'kernel': 'relu'}},
      # k = n / 64 clusters of 64 keys on average (the paper's k ~ sqrt(n) at n = 4,096),
      # one local head (window w) beside one routing head.
      'routing': {'attention': 'routing',
                  'routing': {'num_clusters': max(length // ROUTING_WINDOW, 1),
                              'window': ROUTING_WINDOW, 'local_heads': 1, 'local_window': w},
                  'aux_loss_weights': {'commitment_loss': 1e-3}},
      'etc': {'attention': 'etc', 'etc': {'radius': w, 'max_global': 1}},
      # 4 blocks: one head within its block, the other with the next (a cyclic shift).
      'blockbert': {'attention': 'blockbert', 'blockbert': {'permutations': '0,1,2,3;1,2,3,0'}},
      'bp_transformer': {'attention': 'bp_transformer', 'bp_transformer': {'k': 4}},
  }
  if task == 'pathfinder':
    side = 32
    out['image_local_2d'] = {'attention': 'image_local', 'image_local': {
        'layout': '2d', 'image_height': side, 'image_width': side, 'block_height': 8,
        'block_width': 8, 'flange_height': 8, 'flange_width': 8}}
  return out


def data_section(task: str, variant: str, scale: str, budget: dict) -> dict:
  """`config.data` of the run."""
  data = {'batch_size': budget['batch_size'], 'eval_batch_size': 100,
          'seq_len': LENGTH[scale][task]}
  data.update(merged({}, DATA[scale][task]))
  if task == 'listops':
    data.update(corpus='listops', tokenizer='listops')
  elif task == 'pathfinder':
    data.update(corpus='pathfinder')
  elif task == 'text':
    data.update(corpus='lra_text')
  else:
    data.update(corpus='lra_retrieval')
  if variant == 'local':
    data['cls_global'] = False
  if variant == 'image_local_2d':
    # Local 2D attention reads the image's raster from position 0: no [CLS] in front.
    data.update(cls_token=False, seq_len=1024)
  return data


def get_config(arg: str = 'listops,vanilla', length: int = 0) -> dict:
  """The run of `arg` = 'TASK,VARIANT[,SCALE]'; `length` (benchmarks/lra_cost.py) sizes the
  variants' length-dependent settings for sequences of that many tokens."""
  parts = [part.strip() for part in arg.split(',') if part.strip()]
  require(len(parts) in (2, 3), '--config',
          f'lra.py:{arg}: expected TASK,VARIANT[,SCALE], e.g. lra.py:listops,bigbird,mini')
  task, variant = parts[0], parts[1]
  scale = parts[2] if len(parts) == 3 else 'mini'
  require(task in TASKS, '--config', f'lra.py:{arg}: unknown task {task!r}; use one of {TASKS}')
  require(scale in SCALES, '--config',
          f'lra.py:{arg}: unknown scale {scale!r}; use one of {SCALES}')
  choices = variants(task, scale, length)
  require(variant in choices, '--config', f'lra.py:{arg}: unknown variant {variant!r} for '
          f'{task}; use one of {tuple(choices)}')
  budget = TRAIN[scale][task]
  model = merged(MODEL[scale] or FULL_MODEL[task], choices[variant])
  model.update(num_classes=10 if task == 'listops' else 2,
               pooling='mean' if task == 'pathfinder' else 'cls')
  steps = budget['steps']
  return {
      'task': 'retrieval' if task == 'retrieval' else 'classification',
      'model': model,
      'data': data_section(task, variant, scale, budget),
      'optimizer': {'learning_rate': budget['learning_rate'], 'warmup_steps': budget['warmup'],
                    'weight_decay': budget.get('weight_decay', 0.01)},
      'train': {'num_steps': steps, 'eval_every': max(steps // 5, 1),
                'checkpoint_every': max(steps // 5, 1), 'log_every': 50,
                'eval_max_examples': 2000},
  }
