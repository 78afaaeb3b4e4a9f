"""`ResolvedModel`: the model config as its Flax modules receive it, typed, frozen, hashable.

It inherits `ModelConfig` (models/model_settings.py), so every shared setting, its default
and its rules live there only, and adds:

  * every registered section (attention variant, block kind, stack kind), typed, in
    `sections` and read as an attribute by its key (`cfg.longformer.window`,
    `cfg.gtrxl.gate`, `cfg.universal_act.max_steps`), and `hibert` (the HiBERT tasks'
    `HibertConfig`) where the task has it;
  * what is derived, not set: `vocab_size` (the tokenizer's, padded to
    `vocab_multiple`; 0 where no embedding reads it) and `layer_index` (the layer a
    per-layer config is for, `layer_schedule.layer_config`; 0 for the whole model).

Only the type is here: it imports no block, no stack and neither of their registries, so
the model floor's modules can name it in their annotations (under `if TYPE_CHECKING:`)
without an import circle. models/resolved_model.py builds one from a resolved
`config.model`.
"""

import dataclasses

from longformer_jax.config.frozen_mapping import FrozenMapping, thaw
from longformer_jax.models.model_settings import ModelConfig


# Values derived from the config and the tokenizer, not settings.
DERIVED = ('vocab_size', 'layer_index')


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResolvedModel(ModelConfig):
  """A checked model config as the Flax modules read it (see the module docstring).

  Attributes (beyond the shared settings it inherits from `ModelConfig`):
    vocab_size: the embedding's rows (the tokenizer's vocabulary, padded); 0: none.
    layer_index: the layer this config is for (`layer_schedule.layer_config`); 0 for the
      whole model.
    sections: section key -> its typed section, for every registered attention variant,
      block kind and stack kind, and `hibert` where the task reads it; each is also an
      attribute (`cfg.longformer` is `cfg.sections['longformer']`).
  """
  vocab_size: int
  layer_index: int
  sections: FrozenMapping

  def __getattr__(self, name: str):
    """A section by its key: `cfg.longformer.window`."""
    sections = vars(self).get('sections')
    if sections is not None and name in sections:
      return sections[name]
    raise AttributeError(f"'ResolvedModel' has no setting or section {name!r}")

  def model_values(self) -> dict:
    """The plain `config.model` dict of this model (every setting, every section as a
    dict; no derived value), as `resolve_model` returns it and checks it again."""
    out = thaw({name: getattr(self, name) for name in ModelConfig.field_names()})
    out.update({name: section.to_dict() for name, section in self.sections.items()})
    return out

  def to_dict(self) -> dict:
    """`model_values()` with `vocab_size` and `layer_index`; `resolved_model` reads it back."""
    return dict(self.model_values(), vocab_size=self.vocab_size, layer_index=self.layer_index)
