"""What a plan measured that a second plan of the same network on the same machine would
measure again: t_grad at each device batch and the collectives' per-call costs — kept in
jaxpar's cache folder (`plan/` of `user_cache`) and reused, keyed by everything they depend
on.

  key   the machine (CPU model, vector instructions, cores, memory; accelerators), the
        versions (jax, jaxlib, flax, optax, numpy, and jaxpar's with a digest of its code:
        `probe.versions`), the backend and the setting (devices,
        processes, each one's cores), and the one-device config with the fields that cannot
        change a gradient's or a collective's time left out (`IGNORED`: the plan's own
        fields, the seed, the run's length and bookkeeping, the processes' addresses).
        Anything else that differs — a version, the network, its width, the image size, the
        batch, the dtype, the malloc setting — is another key: the entry is not used.
  what  t_grad {(batch, devices): seconds}; the calls' calibration (`call_timing.time_calls`)
        in one process only — across processes it is the link's, which no key here sees
        (loopback, a rate-limited link, two hosts), so it is measured every time.

A cached value is an earlier measurement on the same machine: the timing noise from one
run to the next enters the plan with it (the plan says which values it reused), and the
host's speed then — scaled to now, the one-device values by t_grad at the serial batch,
which every plan times again, those on n devices by one batch timed again on n (one process
alone and several at once move apart: `planner.at_host_speed`), and stored so: an entry's
values are at one speed. An
entry of another `FORMAT` (one written before that rule, its values at several sittings'
speeds) is not read. Entries
can be deleted; `config.plan.cache=False` neither reads nor writes them.
"""
import datetime
import hashlib
import json
import os

FORMAT = 2  # 2: every t_grad of an entry at one host speed (`planner.at_host_speed`)
IGNORED = ('plan', 'seed', 'total_steps', 'distributed', 'eval_every', 'log_every',
           'checkpoint_every', 'checkpoint_keep', 'stop_after_steps', 'compilation_cache')


def key(one, machine: dict, versions: dict, backend: str, setting: str) -> dict:
  """The entry's key: what t_grad and the calls depend on (the module docstring)."""
  config = {k: v for k, v in json.loads(one.to_json()).items() if k not in IGNORED}
  config.get('dataset', {}).pop('data_dir', None)  # where the files are, not what they are
  machine = {k: v for k, v in machine.items() if k != 'host'}
  return {'machine': machine, 'versions': versions, 'backend': backend, 'setting': setting,
          'config': config}


def _path(folder: str, k: dict) -> str:
  digest = hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:24]
  return os.path.join(folder, f'{digest}.json')


def load(folder: str, k: dict) -> dict:
  """The entry under `k` as written ({'t_grad': [{'batch', 'devices', 'seconds'}], 'calls',
  'created'}: JSON, to hand to every process), or {} where none (or one that does not read:
  measured again and rewritten)."""
  try:
    with open(_path(folder, k)) as f:
      entry = json.load(f)
    if entry['key'] != json.loads(json.dumps(k)):  # a digest's collision: not this key
      return {}
    if entry.get('format') != FORMAT:  # written under another rule: measured again
      return {}
    return {'t_grad': list(entry['t_grad']), 'calls': entry.get('calls'),
            'created': entry['created']}
  except (OSError, ValueError, KeyError, TypeError):
    return {}


def t_grad_of(entry: dict) -> dict:
  """{(batch, devices): seconds} of an entry (`load`)."""
  return {(t['batch'], t['devices']): t['seconds'] for t in entry.get('t_grad', [])}


def store(folder: str, k: dict, t_grad: dict, calls) -> str:
  """Writes the entry (replacing any under `k`, atomically); returns its path."""
  os.makedirs(folder, exist_ok=True)
  path = _path(folder, k)
  entry = {'key': k, 'format': FORMAT,
           'created': datetime.datetime.now().isoformat(timespec='seconds'),
           't_grad': [{'batch': b, 'devices': n, 'seconds': s}
                      for (b, n), s in sorted(t_grad.items())],
           'calls': calls}
  with open(path + '.tmp', 'w') as f:
    json.dump(entry, f)
  os.replace(path + '.tmp', path)
  return path
