"""The shortcuts beside every Long Range Arena accuracy: what a score means only next to these.

Each baseline is fit on generated training examples and scored on the same
generated test set as the models (docs/lra.md):

  majority           the most common training label, for every task
  first_token_rule   ListOps: the most common label of each top-level operator
                     (MIN -> 0, MAX -> 9, MED -> 4, SM -> its most common value)
  pixel_statistics   Pathfinder: logistic regression on the image's pixel histogram,
                     mean and spread
  byte_prefix        Text: logistic regression on the byte 1-grams and hashed 2-grams
                     of the first 256 bytes; Retrieval: on how much the two documents'
                     first 256 bytes overlap (shared words, their Jaccard index, the
                     cosine of the byte 2-gram counts), which finds a shared citation
                     when both are in view; quick stand-ins for the trained model that
                     reads only those bytes
  length_only        Text and Retrieval: logistic regression on the document lengths

One reference that is not a shortcut, for Text: `known_cut_groups` is told where
each document's seam is, reads each part's group by logistic regression on its
byte 1-grams and hashed 2-grams, and answers whether the two predicted groups
agree. It says what a reader of bags of bytes could reach on the task at its
lengths once it has found the seam.

`softmax_regression` is plain multinomial logistic regression on standardised
features (full-batch gradient descent), enough for these features.
"""

import collections
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

PREFIX_BYTES = 256
WORD = re.compile(rb'[A-Za-z_][A-Za-z0-9_.]*')
NGRAM_BUCKETS = 2048


def softmax_regression(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                       num_classes: int, steps: int = 500, learning_rate: float = 0.5,
                       l2: float = 1e-3) -> np.ndarray:
  """Predicted classes `[n_test]` of a multinomial logistic regression fit on
  `train_x [n, f]`, `train_y [n]` (features standardised by the training set's moments),
  by `steps` of full-batch gradient descent (jitted: numpy's BLAS threads crawl beside XLA's)."""
  mean, std = train_x.mean(0), train_x.std(0) + 1e-8
  xs = jnp.asarray((train_x - mean) / std, jnp.float32)
  xt = jnp.asarray((test_x - mean) / std, jnp.float32)
  weights = _fit(xs, jnp.asarray(train_y, jnp.int32), num_classes, steps, learning_rate, l2)
  return np.asarray(jnp.argmax(xt @ weights[:-1] + weights[-1], axis=1))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _fit(xs, labels, num_classes: int, steps: int, learning_rate, l2) -> jax.Array:
  """`[features + 1, classes]`: the weights and (last row) the biases."""
  onehot = jax.nn.one_hot(labels, num_classes)

  def step(_, weights):
    probs = jax.nn.softmax(xs @ weights[:-1] + weights[-1], axis=1)
    error = (probs - onehot) / xs.shape[0]
    gradient = jnp.concatenate([xs.T @ error, error.sum(0, keepdims=True)], 0)
    return weights - learning_rate * (gradient + l2 * weights)

  return jax.lax.fori_loop(0, steps, step, jnp.zeros((xs.shape[1] + 1, num_classes)))


def accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
  return float(np.mean(np.asarray(predicted) == np.asarray(labels)))


def majority(train_labels, test_labels) -> float:
  """Accuracy of always predicting the most common training label."""
  label = collections.Counter(int(y) for y in train_labels).most_common(1)[0][0]
  return accuracy(np.full(len(test_labels), label), test_labels)


def first_token_rule(train_first, train_labels, test_first, test_labels) -> tuple[float, dict]:
  """`(accuracy, rule)`: each first token predicts its most common training label (a token
  not seen in training predicts the overall most common one)."""
  counts = collections.defaultdict(collections.Counter)
  for token, label in zip(train_first, train_labels):
    counts[token][int(label)] += 1
  overall = collections.Counter(int(y) for y in train_labels).most_common(1)[0][0]
  rule = {token: counter.most_common(1)[0][0] for token, counter in counts.items()}
  predicted = [rule.get(token, overall) for token in test_first]
  return accuracy(np.array(predicted), test_labels), rule


def pixel_statistics_features(images: np.ndarray, bins: int = 32) -> np.ndarray:
  """`images [n, h, w]` uint8 -> `[n, bins + 3]`: the pixel histogram (fractions), the mean,
  the standard deviation and the fraction of non-zero pixels."""
  flat = images.reshape(len(images), -1).astype(np.float64)
  histogram = np.stack([np.histogram(row, bins=bins, range=(0, 256))[0] for row in flat])
  histogram = histogram / flat.shape[1]
  return np.concatenate([histogram, flat.mean(1, keepdims=True), flat.std(1, keepdims=True),
                         (flat > 0).mean(1, keepdims=True)], 1)


def byte_prefix_features(document: bytes, prefix: int = PREFIX_BYTES,
                         buckets: int = NGRAM_BUCKETS) -> np.ndarray:
  """Counts of the byte unigrams and hashed bigrams of the first `prefix` bytes, `[256 + buckets]`
  (bigram (a, b) goes to bucket (a * 257 + b) * 40503 mod 2^16 mod `buckets`)."""
  head = np.frombuffer(document[:prefix], np.uint8).astype(np.int64)
  unigrams = np.bincount(head, minlength=256)
  hashed = ((head[:-1] * 257 + head[1:]) * 40503 % 65536) % buckets
  return np.concatenate([unigrams, np.bincount(hashed, minlength=buckets)]).astype(np.float64)


def pair_overlap_features(first: bytes, second: bytes, prefix: int = PREFIX_BYTES) -> np.ndarray:
  """`[3]`: how much the first `prefix` bytes of two documents overlap: the number of words
  (identifiers, dotted names) they share, the Jaccard index of their word sets, and the cosine
  of their byte-count vectors (`byte_prefix_features`)."""
  first_words = set(WORD.findall(first[:prefix]))
  second_words = set(WORD.findall(second[:prefix]))
  shared = len(first_words & second_words)
  jaccard = shared / max(len(first_words | second_words), 1)
  a, b = byte_prefix_features(first, prefix), byte_prefix_features(second, prefix)
  cosine = a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-9)
  return np.array([shared, jaccard, cosine])


def length_features(lengths: np.ndarray) -> np.ndarray:
  """`[n, k]` document lengths -> `[n, 3k]`: each length, its square and its log."""
  lengths = np.asarray(lengths, np.float64).reshape(len(lengths), -1)
  return np.concatenate([lengths, lengths ** 2, np.log1p(lengths)], 1)


def part_features(data: bytes, buckets: int = 1024) -> np.ndarray:
  """`[256 + buckets]`: log(1 + count) of every byte 1-gram and hashed 2-gram of `data`."""
  return np.log1p(byte_prefix_features(data, prefix=len(data), buckets=buckets))


def known_cut_groups(train_parts, train_groups, test_parts, test_labels) -> float:
  """Text's seam-told reference. `*_parts`: `[n, 2]` byte strings (before and after the
  seam); `train_groups`: `[n, 2]` each part's group (0 / 1); `test_labels`: `[n]` 1 where
  the parts' groups agree. One regression per side, then agreement of the predictions."""
  predicted = []
  for side in (0, 1):
    train_x = np.stack([part_features(parts[side]) for parts in train_parts])
    test_x = np.stack([part_features(parts[side]) for parts in test_parts])
    predicted.append(softmax_regression(train_x, np.asarray(train_groups)[:, side], test_x, 2,
                                        steps=500))
  return accuracy((predicted[0] == predicted[1]).astype(int), test_labels)
