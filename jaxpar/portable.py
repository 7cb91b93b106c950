"""A checkpoint restored onto another mesh, method or number of processes.

A checkpoint holds the state as the strategy that wrote it lays it out (`step.Strategy`:
replicated, split among owners, one copy per device) beside a record of that layout
(`Strategy.checkpoint_layout()`, a small dict that `jaxpar.checkpoint` writes with the config
and versions). Restored onto the same layout, the arrays are read straight onto their
devices. Otherwise the state is read as numpy and passes through one **portable** form that
no mesh fixes,

    params, batch_stats   the model's whole tensors, each with a leading axis of R copies
    optimizer             for each component of the optimizer's state (momentum's trace,
                          Adam's mu and nu), the whole tensors, R-leading; and its counters
    residual              sparsified gossip's error-feedback residual, R-leading (or none)

with R = 1 for every layout but replicas (Local SGD, gossip: R = N), and from there into the
layout the run has now. The layouts (`kind`):

    replicated   all-reduce, hybrid FC: whole tensors (split FC layers are whole global arrays)
    split        the distributed server: the optimizer state of each device's share of every
                 tensor (even: ⌈size/N⌉ elements of each, flattened and padded; greedy: whole
                 tensors by [T] Algorithm 3.7, packed into one vector per device)
    central      the central server: N copies of the weights and of the optimizer state,
                 device 0's being the server's (the others are never read)
    replicas     Local SGD, gossip, sparsified gossip: one replica per device
    owners       Downpour (threads or Ray): the optimizer state in one part per owner device

What a change takes. Where R stays 1, every layout's weights, BN statistics and optimizer
state convert to every other's exactly: 8 → 4 devices, 4 → 8, a 2-D mesh to a 1-D one, any
number of processes, all-reduce ↔ distributed (either placement) ↔ central ↔ asynchronous.
Replicas restored onto the same number of replicas keep each its own; onto another number,
every new replica starts from the **mean** of the saved ones (parameters, statistics,
optimizer state and residual: what Local SGD's next average would make of the parameters),
and onto a layout of one copy, the mean too. Counters (step counts) are the same in every
copy and part. What cannot change is the model (its layers and widths, the dataset's number
of classes) and the optimizer (its name decides its state's components): `Mismatch`, a
message saying what differs.
"""
import dataclasses
import math

import jax
import numpy as np

KINDS = ('replicated', 'split', 'central', 'replicas', 'owners')


class Mismatch(ValueError):
  """A readable checkpoint that does not fit this run's state (the message says what differs)."""


@dataclasses.dataclass
class Portable:
  step: np.ndarray
  examples_seen: np.ndarray
  loss_scale: dict | None    # {'scale', 'good_steps'}, or None
  params: list               # the model's whole tensors, (R, *shape), in flattening order
  batch_stats: list
  optimizer: dict            # component (its path in the optimizer's state) -> whole tensors
  counters: dict             # the optimizer state's other leaves, by path
  residual: list | None      # sparsified gossip's error feedback, whole and R-leading
  replicas: int              # R


def describe(layout: dict) -> str:
  """A layout in words, for the log: 'split (even) over 8 devices'."""
  kind = layout.get('kind', '?')
  if kind == 'split':
    return f"split ({layout['placement']}) over {layout['devices']} devices"
  if kind in ('central', 'replicas'):
    return f"{kind} over {layout['devices']} devices"
  if kind == 'owners':
    return f"asynchronous ({layout['server']} server, {layout['workers']} workers)"
  return kind


# ------------------------------------------------------------------ paths and parts


def path_name(path) -> str:
  """A path in a state as 'opt_state/1/0/trace': the same for the structured state and for
  the nested dicts and lists orbax restores without a target."""
  parts = []
  for entry in path:
    for attribute in ('key', 'idx', 'name'):
      if hasattr(entry, attribute):
        parts.append(str(getattr(entry, attribute)))
        break
  return '/'.join(parts)


def _at(tree, key: str):
  """The subtree at `key` of a structured state or of orbax's nested dicts and lists."""
  for part in key.split('/') if key else ():
    if isinstance(tree, dict):
      tree = tree[part]
    elif isinstance(tree, (list, tuple)) and not hasattr(tree, '_fields'):
      tree = tree[int(part)]
    else:  # a named tuple
      tree = getattr(tree, part)
  return tree


def _get(tree, key: str, what: str):
  try:
    return _at(tree, key)
  except (KeyError, IndexError, AttributeError, ValueError, TypeError):
    raise Mismatch(f"its {what} has no {key!r} (written with another optimizer?)") from None


def owner_parts(layout: dict, sizes: list) -> list:
  """Downpour's (owner, [parameter indices]) parts (`AsyncServer`'s), in the owners' order:
  every tensor on device 0 (central), or by [T] Algorithm 3.7 (distributed)."""
  if layout['server'] == 'central':
    return [(0, list(range(len(sizes))))]
  from jaxpar.parallel.servers import greedy_owners
  owners, _ = greedy_owners(sizes, layout['workers'])
  return sorted({o: [i for i, x in enumerate(owners) if x == o] for o in owners}.items())


def _packed(layout: dict) -> bool:
  return layout['kind'] == 'split' and layout['placement'] == 'greedy' and layout['devices'] > 1


def _roots(layout: dict, sizes: list) -> list:
  """Where the optimizer's own states sit in a layout's optimizer state: [(path, the global
  index of each parameter it holds)] (a packed vector holds them all)."""
  everything = list(range(len(sizes)))
  if layout['kind'] == 'owners':
    return [(str(p), leaves) for p, (_, leaves) in enumerate(owner_parts(layout, sizes))]
  if layout['kind'] == 'replicas' and layout.get('paired'):  # (optimizer's, residual)
    return [('0', everything)]
  return [('', everything)]


def _stacked(layout: dict) -> bool:
  """Whether the layout's weights (central, replicas) and optimizer state carry a leading
  axis of one copy per device (on one device there is one copy, unstacked)."""
  return layout['kind'] in ('central', 'replicas') and layout['devices'] > 1


def _check(layout: dict):
  if layout.get('kind') not in KINDS:
    raise Mismatch(f'its layout {layout!r} is none of {KINDS}')


def _follows(layout: dict, params, count: int):
  """Whether a subtree of a layout's optimizer state follows the parameters (one of the
  optimizer's components), given the parameters' tree and how many a root holds."""
  if _packed(layout):  # each component one vector, the counters scalars
    return lambda x: hasattr(x, 'shape') and len(x.shape) >= 1
  if layout['kind'] in ('split', 'owners'):  # a list of the tensors (raveled, or whole)
    wanted = jax.tree.structure([0] * count)
  else:
    wanted = jax.tree.structure(params)
  return lambda x: jax.tree.structure(x) == wanted


def _components(opt_state, layout: dict, params) -> tuple:
  """(components, counters) of a layout's structured optimizer state: the paths, relative to
  its roots, of the subtrees that follow the parameters, and of the other leaves."""
  sizes = [math.prod(p.shape) for p in jax.tree.leaves(params)]
  prefix, leaves = _roots(layout, sizes)[0]
  follows = _follows(layout, params, len(leaves))
  components, counters = [], []
  for path, x in jax.tree_util.tree_flatten_with_path(_at(opt_state, prefix),
                                                      is_leaf=follows)[0]:
    (components if follows(x) else counters).append(path_name(path))
  return components, counters


# ------------------------------------------------------------------ saved → portable


def read(raw: dict, layout: dict, template, target_layout: dict) -> Portable:
  """The portable form of a checkpoint's `raw` state (orbax's nested dicts and lists of
  numpy arrays), written in `layout`; `template`, this run's abstract state in
  `target_layout`, says which components the optimizer's state has. `Mismatch` if it does
  not fit."""
  _check(layout)
  stacked = _stacked(layout)
  # The central server's BN statistics are replicated; the replicas' one per device.
  stats_stacked = lambda l: _stacked(l) and l['kind'] == 'replicas'
  params = _whole_tree(raw['params'], template.params, stacked, _stacked(target_layout),
                       'parameters')
  stats = _whole_tree(raw['batch_stats'], template.batch_stats, stats_stacked(layout),
                      stats_stacked(target_layout), 'BatchNorm statistics')
  shapes = [p.shape[1:] for p in params]
  sizes = [math.prod(s) for s in shapes]
  components, counter_keys = _components(template.opt_state, target_layout, template.params)
  optimizer = {c: [None] * len(sizes) for c in components}
  counters = {}
  for prefix, leaves in _roots(layout, sizes):
    root = _get(raw['opt_state'], prefix, 'optimizer state')
    for c in components:
      found = [np.asarray(x) for x in jax.tree.leaves(_get(root, c, 'optimizer state'))]
      if _packed(layout):  # one vector of N · capacity
        packing = _packing(layout, sizes)
        found = packing.unpack(found[0].reshape(layout['devices'], packing.capacity))
      if len(found) != len(leaves):
        raise Mismatch(f'its optimizer state {c!r} holds {len(found)} tensors, this run '
                       f'{len(leaves)}')
      for local, i in enumerate(leaves):
        optimizer[c][i] = _whole(np.asarray(found[local]), shapes[i], layout)
    for key in counter_keys:
      if key not in counters:
        value = np.asarray(_get(root, key, 'optimizer state'))
        counters[key] = value[0] if stacked else value
  residual = None
  if layout['kind'] == 'replicas' and layout.get('residual'):
    residual = [_whole(np.asarray(x), s, layout)
                for x, s in zip(jax.tree.leaves(raw['opt_state'][1]), shapes)]
  scale = raw.get('loss_scale')
  return Portable(np.asarray(raw['step']), np.asarray(raw['examples_seen']),
                  {k: np.asarray(v) for k, v in scale.items()} if scale else None,
                  params, stats, optimizer, counters, residual,
                  layout['devices'] if stacked and layout['kind'] == 'replicas' else 1)


def _packing(layout: dict, sizes: list):
  from jaxpar.parallel.servers import Packing
  return Packing.build(sizes, layout['devices'], layout['placement'])


def _whole_tree(raw, like, stacked: bool, like_stacked: bool, what: str) -> list:
  """`raw`'s tensors, (R, *shape) each, checked against `like` (this run's; `stacked`,
  `like_stacked`: whether each has a leading axis of copies)."""
  found = jax.tree_util.tree_flatten_with_path(raw)[0]
  wanted = jax.tree_util.tree_flatten_with_path(like)[0]
  names = lambda leaves: [path_name(p) for p, _ in leaves]
  if names(found) != names(wanted):
    missing = sorted(set(names(wanted)) - set(names(found)))
    extra = sorted(set(names(found)) - set(names(wanted)))
    differ = ([f"this run's {missing[0]!r} is not in it"] if missing else []) + (
        [f"it has {extra[0]!r}, this run has not"] if extra else [])
    raise Mismatch(f"its {what} differ ({len(missing) + len(extra)} names: "
                   f"{'; '.join(differ) or 'another order'})")
  out = []
  for (path, x), (_, w) in zip(found, wanted):
    x = np.asarray(x)
    x = x if stacked else x[None]
    shape = tuple(w.shape[1:] if like_stacked else w.shape)
    if x.shape[1:] != shape:
      raise Mismatch(f"its {what} {path_name(path)!r} are {x.shape[1:]}, this run's {shape}")
    out.append(x)
  return out


def _whole(x: np.ndarray, shape, layout) -> np.ndarray:
  """One saved leaf that follows a parameter, as the whole tensor, R-leading."""
  if _stacked(layout):  # the central server's copy 0 is the server's; replicas all count
    return x if layout['kind'] == 'replicas' else x[:1]
  if layout['kind'] == 'split':  # N · ⌈size/N⌉ elements, flattened (on one device: whole)
    x = x.reshape(-1)[:math.prod(shape)]
  return x.reshape((1, *shape))


# ------------------------------------------------------------------ portable → this run


def lay_out(p: Portable, layout: dict, template) -> tuple:
  """(state, notes): `p` in `layout`, numpy leaves shaped as `template`'s (this run's
  abstract state), and what was changed on the way, in words."""
  _check(layout)
  notes = []
  copies = layout['devices'] if _stacked(layout) else 0  # 0: one unstacked copy
  target_r = copies if layout['kind'] == 'replicas' else 1
  if p.replicas != target_r:
    notes.append(f'the {p.replicas} saved replicas averaged'
                 + (f' into each of the {target_r}' if target_r > 1 else ''))
  fit = lambda x: _replicas(x, target_r)

  def spread(x, stacked):  # one copy per device where the layout stacks them
    x = fit(x)
    if copies and stacked:
      return np.broadcast_to(x, (copies, *x.shape[1:])) if x.shape[0] == 1 else x
    return x[0]
  params = [spread(x, True) for x in p.params]
  stats = [spread(x, layout['kind'] == 'replicas') for x in p.batch_stats]
  params = jax.tree.unflatten(jax.tree.structure(template.params), params)
  stats = jax.tree.unflatten(jax.tree.structure(template.batch_stats), stats)

  sizes = [math.prod(x.shape[1:]) for x in p.params]
  components, _ = _components(template.opt_state, layout, template.params)
  missing = sorted(set(components) - set(p.optimizer))
  if missing:
    raise Mismatch(f'its optimizer state has no {missing[0]!r} (written with another '
                   f'optimizer?)')
  roots = []
  for prefix, leaves in _roots(layout, sizes):
    root = _at(template.opt_state, prefix)
    roots.append(_fill(root, layout, leaves, p, spread, template.params))
  if layout['kind'] == 'owners':
    opt_state = tuple(roots)
  elif layout['kind'] == 'replicas' and layout.get('paired'):
    residual = ()
    if layout.get('residual'):
      like = jax.tree.leaves(template.params)
      residual = p.residual or [np.zeros((1, *x.shape), x.dtype) for x in like]
      if p.residual is None:
        notes.append('the error-feedback residual starts at zero')
      residual = jax.tree.unflatten(jax.tree.structure(template.params),
                                    [spread(x, True) for x in residual])
    elif p.residual is not None:
      notes.append('the error-feedback residual dropped')
    opt_state = (roots[0], residual)
  else:
    if p.residual is not None:
      notes.append('the error-feedback residual dropped')
    opt_state = roots[0]

  loss_scale = template.loss_scale
  if loss_scale is not None:
    if p.loss_scale:
      loss_scale = type(loss_scale)(**{k: np.asarray(p.loss_scale[k], getattr(loss_scale, k).dtype)
                                       for k in p.loss_scale})
    else:  # the template's: the initial scale
      notes.append('the loss scale starts afresh')
  elif p.loss_scale:
    notes.append('the loss scale dropped')
  state = template.replace(step=np.asarray(p.step, template.step.dtype),
                           examples_seen=np.asarray(p.examples_seen, template.examples_seen.dtype),
                           params=params, batch_stats=stats, opt_state=opt_state,
                           loss_scale=loss_scale)
  for (path, x), w in zip(jax.tree_util.tree_flatten_with_path(state)[0],
                          jax.tree.leaves(template)):
    if tuple(np.shape(x)) != tuple(w.shape):  # a layout's own arithmetic gone wrong
      raise AssertionError(f'{path_name(path)}: {np.shape(x)} laid out, {w.shape} wanted')
  return jax.tree.map(lambda x, w: np.asarray(x, w.dtype), state, template), notes


def _replicas(x: np.ndarray, r: int) -> np.ndarray:
  """`x` (R-leading) with `r` copies: itself, or the mean of its copies (integers: the
  first, they are counters), repeated."""
  if x.shape[0] == r:
    return x
  one = x[:1] if not np.issubdtype(x.dtype, np.floating) else x.mean(0, keepdims=True,
                                                                     dtype=np.float64)
  one = one.astype(x.dtype)
  return np.broadcast_to(one, (r, *x.shape[1:]))


def _fill(root, layout: dict, leaves, p: Portable, spread, params):
  """The optimizer state at one root of `layout`, shaped as `root` (abstract), from `p`."""
  follows = _follows(layout, params, len(leaves))
  flat, outer = jax.tree_util.tree_flatten_with_path(root, is_leaf=follows)
  out = []
  for path, like in flat:
    key = path_name(path)
    if not follows(like):
      out.append(np.broadcast_to(p.counters[key], like.shape))
      continue
    whole = p.optimizer[key]
    if _packed(layout):
      sizes = [math.prod(x.shape[1:]) for x in p.params]
      packing = _packing(layout, sizes)
      rows = packing.rows([spread(x, False).reshape(-1) for x in whole])
      out.append(np.asarray(rows).reshape(like.shape))
    elif layout['kind'] == 'split':  # each tensor raveled, padded to N runs of ⌈size/N⌉
      parts = []
      for i, shaped in zip(leaves, jax.tree.leaves(like)):
        flat_i = spread(whole[i], False).reshape(-1)
        size = math.prod(shaped.shape)
        parts.append(np.pad(flat_i, (0, size - flat_i.size)).reshape(shaped.shape))
      out.append(jax.tree.unflatten(jax.tree.structure(like), parts))
    elif layout['kind'] == 'owners':
      out.append(jax.tree.unflatten(jax.tree.structure(like),
                                    [spread(whole[i], False) for i in leaves]))
    else:
      out.append(jax.tree.unflatten(jax.tree.structure(like),
                                    [spread(whole[i], True) for i in leaves]))
  return jax.tree.unflatten(outer, out)
