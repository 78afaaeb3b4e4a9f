"""The remat policies a program applies: the `policy` of every checkpoint equation of a jaxpr."""


def sub_jaxprs(eqn):
  for value in eqn.params.values():
    for sub in (value if isinstance(value, (tuple, list)) else (value,)):
      if hasattr(sub, 'eqns'):
        yield sub
      elif hasattr(getattr(sub, 'jaxpr', None), 'eqns'):
        yield sub.jaxpr


def remat_policies_in(jaxpr) -> list:
  """The `policy` of every checkpoint (remat) equation, nested jaxprs included."""
  found = []
  for eqn in jaxpr.eqns:
    if 'remat' in eqn.primitive.name or 'checkpoint' in eqn.primitive.name:
      found.append(eqn.params.get('policy'))
    for sub in sub_jaxprs(eqn):
      found += remat_policies_in(sub)
  return found
