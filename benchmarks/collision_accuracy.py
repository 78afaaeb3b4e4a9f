r"""Object collisions (configs/collisions.py): accuracy by distance, its shortcuts, what is kept.

  python -m benchmarks.collision_accuracy --workdir=workdirs/collisions_expire_span \
      --workdir=workdirs/collisions_xl --episodes=64 \
      --out=benchmarks/results/collisions/accuracy.json

Reads each run's test episodes (data/collisions.py, the run's own `data.collisions`) one
row per episode from its BOS, in the run's evaluation chunks with the memory carried and
nothing else, every answer read as the blank the model was trained with. A prediction is
the argmax over the four quadrants at the query's last token. It prints per run the accuracy
on the labelled answers, on the easy queries (the most recent collision's pair) and the
others, and by the collision's distance in tokens (bins: within chunk + 256, within chunk +
1,024, beyond); the memory entries held per layer after each chunk, as a share of the
tokens read; and for Expire-Span the learnt spans e_i per layer of the tokens of collision
steps against the other steps'. Beside them, on the same answers, the shortcuts: the
majority quadrant of the training answers, and the quadrant where the first particle is
now. Run from the repository root.
"""

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.passkey_expiry import per_layer
from longformer_jax.data import collisions
from longformer_jax.evaluation.memory_accounting import held_entries
from longformer_jax.evaluation.run_restore import read_run
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.train.lm_objective import chunk_context

QUADRANT_IDS = np.frombuffer(collisions.QUADRANTS, np.uint8).astype(np.int32)
BIN_EDGES = (256, 1024)      # + the chunk: the bins' upper reaches, in tokens


def episode_arrays(episodes: list, bos_id: int) -> dict:
  """`[rows, width]` teacher-forcing arrays: input slot s holds token s - 1 after the BOS,
  every answer read as the blank, as in training."""
  hidden = np.stack([e.tokens.astype(np.int32) for e in episodes])
  rows, width = hidden.shape
  hidden[:, episodes[0].answer_positions] = collisions.HIDDEN_ANSWER
  inputs = np.concatenate([np.full([rows, 1], bos_id, np.int32), hidden[:, :-1]], 1)
  positions = np.tile(np.arange(width, dtype=np.int32), (rows, 1))
  return dict(inputs=inputs, positions=positions, segment_ids=np.zeros_like(inputs),
              doc_start=positions == 0, input_mask=np.ones_like(inputs, bool))


def make_step(model_config):
  """The jitted chunk step: `(memory, quadrant argmax [b, c], spans per layer [b, c])`."""
  model = DecoderLM(model_config)

  @jax.jit
  def step(params, memory, chunk):
    (logits, memory, _), sown = model.apply(
        {'params': params}, chunk['inputs'], memory, chunk_context(chunk, deterministic=True),
        mutable=['intermediates'], capture_intermediates=lambda m, name: name == 'expire_spans')
    chosen = jnp.argmax(logits[..., QUADRANT_IDS], axis=-1)
    return memory, chosen, sown.get('intermediates', {})
  return model, step


def read_run_episodes(workdir: str, episodes: int) -> dict:
  """One run's predictions, memory held and spans on its first `episodes` test episodes."""
  config, tokenizer, params, checkpoint, _ = read_run(workdir)
  section = collisions.CollisionsConfig.build(config.data.collisions, 'data.collisions')
  drawn = [collisions.episode(section, 'test', i) for i in range(episodes)]
  arrays = episode_arrays(drawn, tokenizer.bos_id)
  model_config = lm_model_config(config.model, tokenizer.vocab_size)
  model, step = make_step(model_config)
  chunk_len = config.eval.chunk_len or config.data.chunk_len
  memory = model.init_state(model_config, episodes)
  chosen, spans, held = [], [], []
  width = arrays['inputs'].shape[1]
  for begin in range(0, width, chunk_len):
    chunk = {k: jnp.asarray(v[:, begin:begin + chunk_len]) for k, v in arrays.items()}
    memory, picked, sown = step(params, memory, chunk)
    chosen.append(np.asarray(picked))
    layers = per_layer(sown)
    if layers:
      spans.append([a[:, -chunk['inputs'].shape[1]:] for a in layers])
    held.append(held_entries(memory, episodes).mean() / model_config.num_layers)
  per_step = section.tokens_per_step
  chosen = np.concatenate(chosen, 1)[:, per_step - 1::per_step]     # [rows, steps]
  train_labels = np.concatenate([collisions.episode(section, 'train', i).labels
                                 for i in range(64)])
  result = dict(workdir=workdir, attention=config.model.attention, step=int(checkpoint),
                grid_size=section.grid_size, collisions=dict(section.changed()),
                loss_on=config.data.loss_on,
                majority=int(np.bincount(train_labels[train_labels >= 0], minlength=4).argmax()),
                mem_len=int(config.model.mem_len), chunk_len=int(chunk_len), drawn=drawn,
                chosen=chosen, per_step=per_step,
                held_per_layer=float(np.mean(held)),
                held_share=float(np.mean([h / min(width, (i + 1) * chunk_len)
                                          for i, h in enumerate(held)])))
  if spans:
    by_layer = [np.concatenate([chunk_spans[layer] for chunk_spans in spans], 1)
                for layer in range(len(spans[0]))]
    # Input slot s holds token s - 1; a step's tokens are the slots of its per_step tokens.
    collided = np.stack([np.repeat(e.collided, per_step) for e in drawn])
    collided = np.concatenate([np.zeros([episodes, 1], bool), collided[:, :-1]], 1)
    result['spans'] = [dict(layer=layer, collision=float(s[collided].mean()),
                            other=float(s[~collided].mean()),
                            other_p90=float(np.percentile(s[~collided], 90)))
                       for layer, s in enumerate(by_layer)]
  return result


def accuracy_rows(read: dict) -> dict:
  """Accuracy of the run and of the shortcuts, overall, by query kind and by distance bin."""
  labels = np.stack([e.labels for e in read['drawn']])
  distance = np.stack([e.distance for e in read['drawn']]) * read['per_step']
  easy = np.stack([e.easy for e in read['drawn']])
  first_row = np.stack([e.tokens[0::read['per_step']] for e in read['drawn']]).astype(int)
  first_col = np.stack([e.tokens[1::read['per_step']] for e in read['drawn']]).astype(int)
  here = collisions.quadrant(first_row - collisions.ROW_BASE,
                             first_col - collisions.COLUMN_BASE, read['grid_size'])
  predictions = {'model': read['chosen'], 'majority': np.full_like(labels, read['majority']),
                 'first particle now': here}
  edges = [read['chunk_len'] + e for e in BIN_EDGES]
  for edge in edges:       # what a perfect reader with a fixed reach gets: the bound of XL
    predictions[f'ideal, reach {edge}'] = np.where(distance < edge, labels, read['majority'])
  subsets = {'all': labels >= 0, 'easy': (labels >= 0) & easy, 'other': (labels >= 0) & ~easy,
             f'< {edges[0]}': (labels >= 0) & (distance < edges[0]),
             f'{edges[0]}-{edges[1]}': (labels >= 0) & (distance >= edges[0]) & (distance < edges[1]),
             f'>= {edges[1]}': (labels >= 0) & (distance >= edges[1])}
  return {name: {subset: dict(accuracy=float((p[m] == labels[m]).mean()) if m.any() else None,
                              answers=int(m.sum()))
                 for subset, m in subsets.items()}
          for name, p in predictions.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--workdir', action='append', required=True)
  parser.add_argument('--episodes', type=int, default=64)
  parser.add_argument('--out', default='')
  args = parser.parse_args()
  rows = []
  for workdir in args.workdir:
    read = read_run_episodes(workdir, args.episodes)
    table = accuracy_rows(read)
    subsets = list(table['model'])
    print(f"\n{workdir}: {read['attention']}, memory {read['mem_len']}, chunk "
          f"{read['chunk_len']}, checkpoint step {read['step']}; entries held per layer "
          f"{read['held_per_layer']:.0f} ({read['held_share']:.1%} of the tokens read)")
    print('| predictor | ' + ' | '.join(subsets) + ' |')
    print('|---|' + '---:|' * len(subsets))
    counts = ' | '.join(str(table['model'][s]['answers']) for s in subsets)
    print(f'| answers | {counts} |')
    for name, by_subset in table.items():
      cells = ' | '.join('-' if v['accuracy'] is None else f"{v['accuracy']:.3f}"
                         for v in by_subset.values())
      print(f'| {name} | {cells} |')
    for span in read.get('spans', []):
      print(f"layer {span['layer']}: mean span of collision steps' tokens {span['collision']:.0f}, "
            f"of the others {span['other']:.0f} (90th percentile {span['other_p90']:.0f})")
    rows.append({k: v for k, v in read.items() if k not in ('drawn', 'chosen')}
                | {'episodes': args.episodes, 'accuracy': table})
  if args.out:
    os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
    temporary = args.out + '.tmp'
    with open(temporary, 'w') as f:
      json.dump(rows, f, indent=1)
    os.replace(temporary, args.out)


if __name__ == '__main__':
  main()
