"""The shortcuts beside every Long Range Arena accuracy: what a score means only next to these.

Each baseline is fit on generated training examples and scored on the same
generated test set as the models (docs/lra.md):

  majority           the most common training label, for every task
  first_token_rule   ListOps: the most common label of each top-level operator
                     (MIN -> 0, MAX -> 9, MED -> 4, SM -> its most common value)
  pixel_statistics   Pathfinder: logistic regression on the image's pixel histogram,
                     mean and spread
  byte_prefix        Text and Retrieval: logistic regression on hashed byte 1- and
                     2-grams of each document's first 256 bytes (for pairs: both
                     documents' features and their product); a quick stand-in for
                     the trained model that reads only those bytes
  length_only        Text and Retrieval: logistic regression on the document lengths

`softmax_regression` is plain multinomial logistic regression on standardised
features (full-batch gradient descent), enough for these features.
"""

import collections
import zlib

import numpy as np

PREFIX_BYTES = 256
NGRAM_BUCKETS = 2048


def softmax_regression(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                       num_classes: int, steps: int = 500, learning_rate: float = 0.5,
                       l2: float = 1e-3) -> np.ndarray:
  """Predicted classes `[n_test]` of a multinomial logistic regression fit on
  `train_x [n, f]`, `train_y [n]` (features standardised by the training set's moments)."""
  mean, std = train_x.mean(0), train_x.std(0) + 1e-8
  xs = np.concatenate([(train_x - mean) / std, np.ones((len(train_x), 1))], 1)
  xt = np.concatenate([(test_x - mean) / std, np.ones((len(test_x), 1))], 1)
  onehot = np.eye(num_classes)[train_y]
  weights = np.zeros((xs.shape[1], num_classes))
  for _ in range(steps):
    logits = xs @ weights
    logits -= logits.max(1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(1, keepdims=True)
    gradient = xs.T @ (probs - onehot) / len(xs) + l2 * weights
    weights -= learning_rate * gradient
  return np.argmax(xt @ weights, 1)


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
  (a stable hash: CRC-32 of the two bytes)."""
  head = document[:prefix]
  features = np.zeros(256 + buckets)
  for byte in head:
    features[byte] += 1
  for i in range(len(head) - 1):
    features[256 + zlib.crc32(head[i:i + 2]) % buckets] += 1
  return features


def pair_features(first: np.ndarray, second: np.ndarray) -> np.ndarray:
  """Features of a document pair from each document's: both, and their product (so a linear
  model can match them)."""
  return np.concatenate([first, second, first * second], -1)


def length_features(lengths: np.ndarray) -> np.ndarray:
  """`[n, k]` document lengths -> `[n, 3k]`: each length, its square and its log."""
  lengths = np.asarray(lengths, np.float64).reshape(len(lengths), -1)
  return np.concatenate([lengths, lengths ** 2, np.log1p(lengths)], 1)
