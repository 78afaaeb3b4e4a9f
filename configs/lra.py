r"""The Long Range Arena (Tay et al., 2020): one config per task, attention variant and scale.

  python train.py --config=configs/lra.py:TASK,VARIANT[,SCALE] --workdir=W
  python eval.py  --config=configs/lra.py:TASK,VARIANT[,SCALE] --workdir=W --config.eval.split=test

Self-pretraining (Amos et al., 2024): `TASK,VARIANT,SCALE,masked` is the same encoder trained
by masked-token prediction on the task's own training inputs (task masked_pretraining; ListOps,
Pathfinder and Text), and a classification run starts from it with
`--config.train.init_from=W_MASKED` (docs/lra.md, "Self-pretraining").

TASK (data generated here, docs/lra.md):
  listops      ListOps trees, 10 classes, [CLS] pooling (data/lra/listops.py)
  pathfinder   Pathfinder images, pixels as tokens, mean pooling (data/lra/pathfinder.py)
  text         two excerpts of the standard library: the same kind of file or not, bytes,
               [CLS] pooling (data/lra/text_classification.py; replaces IMDb)
  retrieval    two documents: do they cite the same module, two towers, [CLS] pooling
               (data/lra/document_matching.py; replaces AAN)

VARIANT: the encoder's attention (`variants` below): vanilla, local (Longformer's window
without a global token), longformer (window + global [CLS]), bigbird, sparse_strided,
sparse_fixed, reformer (LSH), performer, performer_relu, routing, etc, blockbert,
bp_transformer, and image_local_2d (pathfinder only).

SCALE:
  mini (default)  2 CPU cores: the smallest budget at which vanilla learns what it can of each
                  task here (docs/lra.md measures it); every length at least 8x the local
                  window (2w + 1 keys) and the blocks scaled with it
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
PRETRAINING = 'masked'       # the fourth part of the config argument: self-pretraining
SCALES = ('mini', 'full')
SMALL = {'num_layers': 2, 'd_model': 64, 'num_heads': 2, 'head_dim': 32, 'd_ff': 128}

# Per scale and task: the model; the sequence (tokens per document, [CLS] included: a
# multiple of every blocked variant's blocks, holding the content whole); the attention
# shapes (one-sided window w, block, LSH chunk, routing window, BlockBERT blocks, Performer
# features); the data; the training budget.
SHAPES = {
    'mini': {
        # Trees of depth 2 (operators nest twice), 64-123 tokens: a 2-layer d_model 64
        # encoder stays at the first-token rule on LRA's deeper trees (docs/lra.md).
        'listops': dict(
            model={'num_layers': 4, 'd_model': 128, 'num_heads': 4, 'head_dim': 32,
                   'd_ff': 256},
            length=128, window=3, block=2, lsh_chunk=16, routing_window=16, blockbert=8,
            features=64,
            data={'listops': {'min_length': 64, 'max_length': 124, 'max_depth': 3,
                              'operator_probability': 0.5, 'train_examples': 64_000}},
            train={'batch_size': 32, 'steps': 4000, 'learning_rate': 1e-3, 'warmup': 200}),
        'pathfinder': dict(
            model=SMALL, length=1056, window=16, block=16, lsh_chunk=32, routing_window=64,
            blockbert=4, features=128,
            data={'pathfinder': {'dashes_per_path': 6, 'distractor_dashes': 0,
                                 'train_examples': 48_000}},
            train={'batch_size': 16, 'steps': 1500, 'learning_rate': 1e-3, 'warmup': 100}),
        'text': dict(
            model=SMALL, length=768, window=16, block=16, lsh_chunk=32, routing_window=64,
            blockbert=4, features=128,
            data={'lra_text': {'min_bytes': 512, 'max_bytes': 767, 'train_examples': 96_000}},
            train={'batch_size': 32, 'steps': 3000, 'learning_rate': 1e-3, 'warmup': 100}),
        'retrieval': dict(
            model=SMALL, length=1024, window=16, block=16, lsh_chunk=32, routing_window=64,
            blockbert=4, features=128,
            # The first 900 steps read the same pairs at 64-127 bytes (the length
            # curriculum): without it vanilla stays at chance within this budget, with it
            # 0.7585 (docs/lra.md, "Where Retrieval's plateau starts").
            data={'lra_retrieval': {'min_bytes': 768, 'max_bytes': 1023,
                                    'train_examples': 48_000, 'curriculum_steps': 900}},
            train={'batch_size': 16, 'steps': 1500, 'learning_rate': 1e-3, 'warmup': 100}),
    },
    # LRA's transformer_base shapes and budgets. Its peak learning rates (0.05 x
    # rsqrt(warmup) under 'constant * linear_warmup * rsqrt_decay'; Pathfinder: 1e-3 with a
    # cosine) run under this project's AdamW warm-up and cosine decay (train/optimizer.py).
    'full': {
        'listops': dict(
            model={'num_layers': 6, 'd_model': 512, 'num_heads': 8, 'head_dim': 64,
                   'd_ff': 2048},
            length=2048, window=128, block=64, lsh_chunk=64, routing_window=64, blockbert=4,
            features=256, data={},                       # 500-2,000 tokens, 96,000 trees
            train={'batch_size': 32, 'steps': 5000, 'learning_rate': 1.6e-3, 'warmup': 1000,
                   'weight_decay': 0.1}),
        'pathfinder': dict(
            model={'num_layers': 1, 'd_model': 128, 'num_heads': 4, 'head_dim': 16,
                   'd_ff': 128, 'dropout_rate': 0.2},
            length=1088, window=128, block=64, lsh_chunk=64, routing_window=64, blockbert=4,
            features=256, data={},                       # the hard set, 160,000 images
            train={'batch_size': 512, 'steps': 62_500, 'learning_rate': 1e-3, 'warmup': 312,
                   'weight_decay': 0.0}),
        'text': dict(
            model={'num_layers': 4, 'd_model': 256, 'num_heads': 4, 'head_dim': 64,
                   'd_ff': 1024},
            length=4096, window=128, block=64, lsh_chunk=64, routing_window=64, blockbert=4,
            features=256, data={'lra_text': {'max_bytes': 4095}},   # 1-4K bytes, 25,000
            train={'batch_size': 32, 'steps': 20_000, 'learning_rate': 5.6e-4,
                   'warmup': 8000, 'weight_decay': 0.1}),
        'retrieval': dict(
            model={'num_layers': 4, 'd_model': 128, 'num_heads': 4, 'head_dim': 32,
                   'd_ff': 512},
            length=4096, window=128, block=64, lsh_chunk=64, routing_window=64, blockbert=4,
            features=256, data={'lra_retrieval': {'max_bytes': 4095}},  # 147,086 pairs
            train={'batch_size': 32, 'steps': 5000, 'learning_rate': 5.6e-4, 'warmup': 1000,
                   'weight_decay': 0.1}),
    },
}


def blockbert_permutations(blocks: int) -> str:
  """One head group within its block, the other with the next block (a cyclic shift)."""
  identity = ','.join(str(i) for i in range(blocks))
  shift = ','.join(str((i + 1) % blocks) for i in range(blocks))
  return f'{identity};{shift}'


def variants(task: str, scale: str, length: int = 0) -> dict:
  """`{variant: model settings}` for `task` at `scale` on sequences of `length` tokens
  (0: the task's)."""
  shape = SHAPES[scale][task]
  w, block = shape['window'], shape['block']
  length = length or shape['length']
  performer = {'num_features': shape['features']}
  out = {
      'vanilla': {'attention': 'vanilla'},
      'local': {'attention': 'longformer', 'longformer': {'window': w}},
      'longformer': {'attention': 'longformer', 'longformer': {'window': w}},
      'bigbird': {'attention': 'bigbird',
                  'bigbird': {'block': block, 'window_blocks': 1, 'random_blocks': 2,
                              'global_blocks': 1}},
      'sparse_strided': {'attention': 'sparse_transformer',
                         'sparse_transformer': {'pattern': 'strided', 'stride': 2 * block}},
      'sparse_fixed': {'attention': 'sparse_transformer',
                       'sparse_transformer': {'pattern': 'fixed', 'stride': 2 * block,
                                              'summary_len': 2}},
      'reformer': {'attention': 'lsh',
                   'lsh': {'num_hashes': 2, 'num_buckets': 8, 'chunk_len': shape['lsh_chunk']}},
      'performer': {'attention': 'performer', 'performer': performer},
      'performer_relu': {'attention': 'performer', 'performer': dict(performer, kernel='relu')},
      # k = n / window clusters (the paper's k ~ sqrt(n) at n = 4,096 for a window of 64),
      # one local head (window w) beside one routing head.
      'routing': {'attention': 'routing',
                  'routing': {'num_clusters': max(length // shape['routing_window'], 1),
                              'window': shape['routing_window'], 'local_heads': 1,
                              'local_window': w},
                  'aux_loss_weights': {'commitment_loss': 1e-3}},
      'etc': {'attention': 'etc', 'etc': {'radius': w, 'max_global': 1}},
      'blockbert': {'attention': 'blockbert',
                    'blockbert': {'permutations': blockbert_permutations(shape['blockbert'])}},
      'bp_transformer': {'attention': 'bp_transformer', 'bp_transformer': {'k': 4}},
  }
  if task == 'pathfinder':
    # Local 2D attention over the 32 x 32 raster: 8 x 8 query blocks, flanges of 8.
    out['image_local_2d'] = {'attention': 'image_local', 'image_local': {
        'layout': '2d', 'image_height': 32, 'image_width': 32, 'block_height': 8,
        'block_width': 8, 'flange_height': 8, 'flange_width': 8}}
  return out


def data_section(task: str, variant: str, scale: str) -> dict:
  """`config.data` of the run."""
  shape = SHAPES[scale][task]
  data = {'batch_size': shape['train']['batch_size'], 'eval_batch_size': 100,
          'seq_len': shape['length']}
  data.update(merged({}, shape['data']))
  data['corpus'] = {'listops': 'listops', 'pathfinder': 'pathfinder', 'text': 'lra_text',
                    'retrieval': 'lra_retrieval'}[task]
  if task == 'listops':
    data['tokenizer'] = 'listops'
  if variant == 'local':
    data['cls_global'] = False
  if variant == 'image_local_2d':
    # Local 2D attention reads the image's raster from position 0: no [CLS] in front.
    data.update(cls_token=False, seq_len=1024)
  return data


def get_config(arg: str = 'listops,vanilla', length: int = 0) -> dict:
  """The run of `arg` = 'TASK,VARIANT[,SCALE[,masked]]'; `length` (benchmarks/lra_cost.py)
  sizes the variants' length-dependent settings for sequences of that many tokens."""
  parts = [part.strip() for part in arg.split(',') if part.strip()]
  require(len(parts) in (2, 3, 4) and (len(parts) < 4 or parts[3] == PRETRAINING), '--config',
          f'lra.py:{arg}: expected TASK,VARIANT[,SCALE[,{PRETRAINING}]], e.g. '
          'lra.py:listops,bigbird,mini')
  task, variant = parts[0], parts[1]
  scale = parts[2] if len(parts) >= 3 else 'mini'
  masked = len(parts) == 4
  require(task in TASKS, '--config', f'lra.py:{arg}: unknown task {task!r}; use one of {TASKS}')
  require(scale in SCALES, '--config',
          f'lra.py:{arg}: unknown scale {scale!r}; use one of {SCALES}')
  choices = variants(task, scale, length)
  require(variant in choices, '--config', f'lra.py:{arg}: unknown variant {variant!r} for '
          f'{task}; use one of {tuple(choices)}')
  if masked:
    require(task != 'retrieval', '--config', f'lra.py:{arg}: self-pretraining reads one '
            "encoder's examples (listops, pathfinder, text), not retrieval's pairs")
  shape = SHAPES[scale][task]
  budget = shape['train']
  model = merged(shape['model'], choices[variant])
  model.update(num_classes=10 if task == 'listops' else 2,
               pooling='mean' if task == 'pathfinder' else 'cls')
  steps = budget['steps']
  if masked:                # the same encoder, data and budget; BERT's masking (15%)
    del model['num_classes'], model['pooling']
  return {
      'task': ('masked_pretraining' if masked else
               'retrieval' if task == 'retrieval' else 'classification'),
      'model': model,
      'data': data_section(task, variant, scale),
      'optimizer': {'learning_rate': budget['learning_rate'], 'warmup_steps': budget['warmup'],
                    'weight_decay': budget.get('weight_decay', 0.01)},
      'train': {'num_steps': steps, 'eval_every': max(steps // 5, 1),
                'checkpoint_every': max(steps // 5, 1), 'log_every': 50,
                'eval_max_examples': 2000},
  }
