"""The suite's own check: small, plausible bugs that the default suite must catch.

Each mutation is one exact edit of one source line. For each, this copies the
checkout's tracked files (with uncommitted edits) into a temporary folder, applies
the edit there, and runs the default-suite tests that guard the mutated module
(the default markers, so a test marked slow does not count). A mutation is
caught when pytest reports failing tests (exit status 1); a collection or usage
error (status 2-4) is reported as such, not as a catch. The checkout itself is
never modified.

    python tools/mutation_check.py                 # every mutation
    python tools/mutation_check.py --only=lsh_self_logit_0,xl_clamp_plus_1

Prints one line per mutation and exits 1 if any was missed. docs/design.md
("The suite's own check") has the list and the last measured table.
"""

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Mutation:
  name: str
  path: str            # the mutated file, relative to the repository root
  original: str        # text that must occur exactly once in the file
  mutated: str         # what replaces it
  tests: tuple         # the default-suite test files (or node ids) that guard it


MUTATIONS = (
    Mutation('longformer_reach_plus_1', 'longformer_jax/attention/longformer/attention.py',
             'context.segment_ids, key_valid, window=self.config.window, dilation=dilation,',
             'context.segment_ids, key_valid, window=self.config.window + 1, dilation=dilation,',
             ('tests/attention/test_longformer_attention.py',)),
    Mutation('lsh_self_logit_0', 'longformer_jax/attention/lsh/attention.py',
             'SELF_LOGIT = -1e5', 'SELF_LOGIT = 0.0',
             ('tests/attention/test_lsh_attention.py',)),
    Mutation('xl_clamp_plus_1', 'longformer_jax/attention/xl.py',
             'distances = jnp.minimum(distances, clamp_len)',
             'distances = jnp.minimum(distances, clamp_len + 1)',
             ('tests/attention/test_xl_attention.py',)),
    Mutation('no_remat', 'longformer_jax/models/standard_stack.py',
             "if cfg.remat_policy != 'none':", 'if False:',
             ('tests/models/test_contract_stacks.py',)),
    Mutation('lra_max_read_as_sum', 'longformer_jax/data/lra/listops.py',
             'return max(values)', 'return sum(values) % 10',
             ('tests/data_pipeline/test_lra_listops.py',)),
    Mutation('initial_score_mean_plus_k_std', 'longformer_jax/memory/policies.py',
             'score = mean - policy.init_std_multiplier * jnp.sqrt(variance)',
             'score = mean + policy.init_std_multiplier * jnp.sqrt(variance)',
             ('tests/memory/test_memory_policies.py', 'tests/memory/test_policy_reference.py')),
)


def copy_checkout(destination: str) -> None:
  """Copies the tracked files of the checkout (as they are on disk) into `destination`."""
  listed = subprocess.run(['git', 'ls-files', '-z'], cwd=REPO_ROOT, check=True,
                          capture_output=True).stdout.decode().split('\0')
  for relative in filter(None, listed):
    source = os.path.join(REPO_ROOT, relative)
    if not os.path.isfile(source):
      continue    # deleted in the working tree
    target = os.path.join(destination, relative)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copy2(source, target)


def apply(mutation: Mutation, root: str) -> None:
  path = os.path.join(root, mutation.path)
  with open(path, encoding='utf-8') as f:
    text = f.read()
  count = text.count(mutation.original)
  if count != 1:
    raise SystemExit(f'mutation {mutation.name}: {mutation.path} has {count} copies of '
                     f'{mutation.original!r}, expected exactly 1 (update tools/mutation_check.py)')
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text.replace(mutation.original, mutation.mutated))


def run_one(mutation: Mutation) -> tuple:
  """`(verdict, seconds, pytest's last line and first failing test)` for one mutation."""
  with tempfile.TemporaryDirectory(prefix=f'mutation_{mutation.name}_') as root:
    copy_checkout(root)
    apply(mutation, root)
    start = time.time()
    result = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-n', '0', '-x', '-p', 'no:cacheprovider',
         *mutation.tests], cwd=root, capture_output=True, text=True)
    seconds = time.time() - start
  lines = [line for line in result.stdout.splitlines() if line.strip()]
  summary = lines[-1] if lines else result.stderr.strip()[-200:]
  failed = [line.split()[1] for line in lines if line.startswith('FAILED ')]
  if failed:
    summary += f'; first failure {failed[0]}'

  verdict = {0: 'MISSED', 1: 'caught'}.get(result.returncode, f'error (status {result.returncode})')
  return verdict, seconds, summary


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--only', default='', help='comma-separated mutation names')
  args = parser.parse_args()
  chosen = [m for m in MUTATIONS if not args.only or m.name in args.only.split(',')]
  unknown = set(filter(None, args.only.split(','))) - {m.name for m in MUTATIONS}
  if unknown:
    print(f'--only: unknown mutation(s) {sorted(unknown)}; choose from '
          f'{[m.name for m in MUTATIONS]}', file=sys.stderr)
    return 2
  missed = 0
  for mutation in chosen:
    verdict, seconds, summary = run_one(mutation)
    missed += verdict != 'caught'
    print(f'{mutation.name:32s} {verdict:8s} {seconds:6.1f} s  {" ".join(mutation.tests)}: '
          f'{summary}', flush=True)
  return 1 if missed else 0


if __name__ == '__main__':
  sys.exit(main())
