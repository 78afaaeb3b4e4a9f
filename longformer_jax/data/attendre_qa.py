"""Reading-comprehension documents built like Attendre's TriviaQA template, in miniature.

Attendre (Yang & Hua et al., 2024, sec. 4) puts the question before a long context, so a
memory that evicts by attention must keep the question while the context streams past, and
the context's attention to the question decides what else is kept. A document here is

  Question: what is the <attribute> of <Entity>?
  Context: <passage> <passage> ... <passage>
  Answer: <value>.

- Each passage is about one entity: two or three facts "<Entity>'s <attribute> is <value>."
  among plain filler sentences.
- Exactly one passage states the question's fact (`<Entity>'s <attribute> is`); it sits at a
  uniform random depth of the context (or the depth asked for).
- Distractor passages name the question's entity with other attributes, and other entities'
  passages state the question's attribute with other values: neither the entity nor the
  attribute alone finds the answer.
- Entities are made-up names (syllables of a fixed list), values are words of fixed
  lists per attribute: nothing a model could know beforehand. Everything is ASCII, so with
  the byte tokenizer the offsets below are token offsets.

The built-in corpus `attendre_qa` (`data.corpus='attendre_qa'`, `load_documents`) holds
such documents, their contexts `data.passkey_min_length` to `data.passkey_max_length`
bytes (default 256 to 1,024; the passkey corpus's length settings), for language-model
training with the memory in the loop: 16,384 training documents, 128 each for valid and
test, fixed seeds per split.

A document is a pure function of its seed and its requested length and depth
(`np.random.default_rng([seed, ...])`). It is scored by exact match of the greedy answer
(`exact_match`). `partial_reader_answer` is the shortcut every score is read beside: a
perfect reader that sees only the context's last bytes (a model whose memory keeps nothing
older than its chunk) answers when the fact lies there and guesses otherwise.
"""

import dataclasses
import re

import numpy as np

from longformer_jax.config.errors import ConfigError
from longformer_jax.data import passkey
from longformer_jax.data.document import Document

SYLLABLES = ('ka', 'lo', 'mi', 'ren', 'to', 'sa', 'vi', 'dor', 'ne', 'pa', 'qui', 'bel',
             'zu', 'fa', 'gor', 'hi', 'jen', 'mo', 'ri', 'tas', 'vel', 'wi', 'yo', 'ces')
ATTRIBUTES = {
    'city': ('Aldmere', 'Brisk', 'Corvale', 'Dunmoor', 'Eastwick', 'Fenhold', 'Gravon',
             'Harlow', 'Ilmarsh', 'Jorvik', 'Kestrel', 'Lunford'),
    'color': ('amber', 'azure', 'crimson', 'olive', 'ivory', 'teal', 'violet', 'ochre',
              'silver', 'scarlet', 'jade', 'indigo'),
    'animal': ('otter', 'heron', 'lynx', 'badger', 'falcon', 'marten', 'newt', 'bison',
               'crane', 'ferret', 'gecko', 'ibex'),
    'metal': ('cobalt', 'copper', 'nickel', 'zinc', 'tin', 'bronze', 'iron', 'lead',
              'silver', 'gold', 'pewter', 'brass'),
    'river': ('Ambel', 'Brue', 'Carn', 'Dove', 'Esk', 'Frome', 'Glen', 'Hull', 'Isle',
              'Kent', 'Lune', 'Mole'),
    'number': tuple(str(n) for n in range(11, 99, 7)),
}
FILLER = ('It rained in the morning. The road was long and quiet. People talked about the '
          'harvest. Nobody was in a hurry that day. The market opened late. ')
FILLER_SENTENCES = tuple(s.strip() + '.' for s in FILLER.split('.') if s.strip())

QUESTION = 'Question: what is the {attribute} of {entity}?\nContext:'
FACT = " {entity}'s {attribute} is {value}."
ANSWER_PROMPT = '\nAnswer: '
ANSWER_END = '.'
# The smallest context that holds the answer passage and one distractor.
MIN_CONTEXT = 256
DEFAULT_MAX_CONTEXT = 1024

SPLITS = ('train', 'valid', 'test')
SPLIT_SEEDS = {'train': 2001, 'valid': 2002, 'test': 2003}
SPLIT_SIZES = {'train': 16384, 'valid': 128, 'test': 128}


@dataclasses.dataclass(frozen=True)
class QaDocument:
  """One document. `prompt` ends with 'Answer: '; `answer` is the value, without the '.'.

  `answer_offset`, `answer_passage_len`: where in `prompt` the answer passage starts, and its
  bytes; `depth`: its place in the context, 0 (first) to 1 (last).
  """
  prompt: str
  answer: str
  entity: str
  attribute: str
  answer_offset: int
  answer_passage_len: int
  depth: float

  @property
  def text(self) -> str:
    """The whole document, the answer and its '.' included (what a model trains on)."""
    return self.prompt + self.answer + ANSWER_END

  @property
  def question(self) -> str:
    return self.prompt[:self.prompt.index('\nContext:')]

  @property
  def context(self) -> str:
    start = self.prompt.index('\nContext:') + len('\nContext:')
    return self.prompt[start:len(self.prompt) - len(ANSWER_PROMPT)]


def _name(rng: np.random.Generator) -> str:
  syllables = rng.choice(len(SYLLABLES), size=int(rng.integers(2, 4)))
  return ''.join(SYLLABLES[i] for i in syllables).capitalize()


def _entities(rng: np.random.Generator, count: int) -> list:
  names = []
  while len(names) < count:
    name = _name(rng)
    if name not in names:
      names.append(name)
  return names


def _passage(rng, entity: str, facts: list) -> str:
  """Filler sentences with the facts `(attribute, value)` about `entity` among them."""
  pieces = [FACT.format(entity=entity, attribute=a, value=v) for a, v in facts]
  pieces += [' ' + FILLER_SENTENCES[i]
             for i in rng.choice(len(FILLER_SENTENCES), size=int(rng.integers(1, 4)))]
  order = rng.permutation(len(pieces))
  return ''.join(pieces[i] for i in order)


def make_document(seed: int, context_length: int, depth: float | None = None) -> QaDocument:
  """A document whose context has about `context_length` bytes (passages are whole, so the
  context ends within one passage of it); the answer passage at `depth` of the passages
  (None: uniform random)."""
  if context_length < MIN_CONTEXT:
    raise ConfigError('context_length', f'{context_length} must be >= {MIN_CONTEXT}')
  if depth is not None and not 0.0 <= depth <= 1.0:
    raise ConfigError('depth', f'{depth} must be in [0, 1]')
  rng = np.random.default_rng([seed, context_length, 0 if depth is None else 1 + int(depth * 1e6)])
  attributes = sorted(ATTRIBUTES)
  attribute = attributes[int(rng.integers(len(attributes)))]
  names = _entities(rng, 64)
  entity, others = names[0], names[1:]
  answer = ATTRIBUTES[attribute][int(rng.integers(len(ATTRIBUTES[attribute])))]

  def other_value(name, exclude):
    values = [v for v in ATTRIBUTES[name] if v != exclude]
    return values[int(rng.integers(len(values)))]

  other_attributes = [a for a in attributes if a != attribute]
  answer_passage = _passage(rng, entity, [(attribute, answer)] + [
      (a, other_value(a, None)) for a in rng.choice(other_attributes, 1, replace=False)])
  passages = []
  size = len(answer_passage)
  while size < context_length or len(passages) < 2:
    if len(passages) % 4 == 1:      # a distractor: the question's entity, other attributes
      facts = [(a, other_value(a, None))
               for a in rng.choice(other_attributes, int(rng.integers(1, 3)), replace=False)]
      passage = _passage(rng, entity, facts)
    else:                           # another entity, often with the question's attribute
      name = others[int(rng.integers(len(others)))]
      chosen = list(rng.choice(attributes, int(rng.integers(2, 4)), replace=False))
      facts = [(a, other_value(a, answer if a == attribute else None)) for a in chosen]
      passage = _passage(rng, name, facts)
    passages.append(passage)
    size += len(passage)
  slot = int(rng.integers(len(passages) + 1)) if depth is None else round(depth * len(passages))
  passages.insert(slot, answer_passage)
  head = QUESTION.format(attribute=attribute, entity=entity)
  offset = len(head) + sum(len(p) for p in passages[:slot])
  prompt = head + ''.join(passages) + ANSWER_PROMPT
  return QaDocument(prompt=prompt, answer=answer, entity=entity, attribute=attribute,
                    answer_offset=offset, depth=slot / (len(passages) - 1),
                    answer_passage_len=len(answer_passage))


def grid_document(seed: int, context_length: int, depth: float, index: int,
                  encode=passkey.byte_encode) -> passkey.PasskeyDocument:
  """Document `index` of a passkey-grid cell (evaluation/passkey_grid.py, `kind=attendre_qa`)
  in the grid's form: the answer passage is the needle, the value and its '.' the answer
  (all of its tokens right under teacher forcing = the greedy answer's exact match). The
  pieces are encoded one by one, so the offsets are exact with any tokenizer."""
  document = make_document(seed * 1_000_003 + index, context_length, depth)
  start, end = document.answer_offset, document.answer_offset + document.answer_passage_len
  pieces = [encode(text) for text in (document.prompt[:start], document.prompt[start:end],
                                      document.prompt[end:], document.answer + ANSWER_END)]
  tokens = np.concatenate(pieces).astype(np.int32)
  return passkey.PasskeyDocument(
      tokens=tokens, key=document.answer, depth=float(depth), needle_start=pieces[0].size,
      answer_start=tokens.size - pieces[3].size, answer_len=pieces[3].size,
      needle_len=pieces[1].size)


def fact_pattern(entity: str, attribute: str) -> str:
  """The text that states an entity's attribute (up to its value)."""
  return FACT.format(entity=entity, attribute=attribute, value='')[:-2]


def exact_match(prediction: str, answer: str) -> bool:
  """The greedy answer up to its first '.' or newline, stripped, equals the value."""
  return re.split(r'[.\n]', prediction, maxsplit=1)[0].strip() == answer


def partial_reader_answer(document: QaDocument, seen: int) -> str:
  """The answer of a perfect reader that sees the question and only the context's last
  `seen` bytes: the stated value where the question's fact lies within them, else a guess
  (the attribute's first value; right 1 time in 12)."""
  tail = document.context[-seen:]
  pattern = re.escape(fact_pattern(document.entity, document.attribute)) + r' ([^.]+)\.'
  found = re.search(pattern, tail)
  return found.group(1) if found else ATTRIBUTES[document.attribute][0]


def load_documents(split: str, max_length: int = 0, min_length: int = 0,
                   spread: str = 'uniform') -> list[Document]:
  """The `attendre_qa` corpus split: `SPLIT_SIZES[split]` documents (their whole text, the
  answer included), contexts of `max(min_length, MIN_CONTEXT)` to `max_length` bytes
  (0: DEFAULT_MAX_CONTEXT), uniform or log-uniform in length, answer depths uniform.

  Raises:
    ConfigError: an unknown split ('eval.split'), or lengths below MIN_CONTEXT
      ('data.passkey_max_length').
  """
  if split not in SPLITS:
    raise ConfigError('eval.split', f'unknown split {split!r} of the attendre_qa corpus; '
                      f'expected one of {SPLITS}')
  longest = max_length or DEFAULT_MAX_CONTEXT
  shortest = max(min_length, MIN_CONTEXT)
  if longest < shortest:
    raise ConfigError('data.passkey_max_length', f'corpus attendre_qa needs contexts of at '
                      f'least {shortest} bytes, got {longest}')
  documents = []
  for index in range(SPLIT_SIZES[split]):
    length = passkey.document_length(np.random.default_rng([SPLIT_SEEDS[split], index]),
                                     shortest, longest, spread)
    document = make_document(SPLIT_SEEDS[split] * 1_000_000 + index, length)
    documents.append(Document(name=f'attendre_qa/{split}/{index}',
                              data=document.text.encode('ascii'),
                              answer_start=len(document.prompt)))
  return documents
