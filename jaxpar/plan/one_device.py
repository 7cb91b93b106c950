"""`python -m jaxpar.plan.one_device SPEC.json`: a plan's one-device measurements
(`planner.measure_one_device`: the serial run, t_grad on one device, the one-device
candidates' steps) in a process of its own, for a plan made across processes — where a
one-device run is a run of one process (`planner.one_device_in_child` writes SPEC: the
one-device config as JSON, the target, the batches, the candidates to time, the seconds
left, the file to write and the pipe to answer on). Written, it keeps the one-device
candidates' loops open and times a window of one whenever asked (`serve`), until its stdin
ends: phase 5 of the plan takes their windows in turn with the other candidates'.
"""
import json
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


def tuples(value):
  """JSON's lists back to the tuples a config holds (mesh.shape, mesh.axes)."""
  if isinstance(value, dict):
    return {k: tuples(v) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(tuples(v) for v in value)
  return value


def main(path: str) -> None:
  import ml_collections

  from jaxpar import compile_cache, host_memory, metrics
  from jaxpar import mesh as mesh_lib
  from jaxpar.data import sources
  from jaxpar.plan import planner, probe
  with open(path) as f:
    spec = json.load(f)
  metrics.quiet_libraries()
  cfg = ml_collections.ConfigDict(tuples(json.loads(spec['config'])))
  host_memory.keep_freed_memory(cfg.host_memory)  # the planning process's (`one_device_in_child`)
  # A run of one process: its programs kept and loaded as a one-process plan's are (the
  # serial runs at further seeds compile the first seed's programs again).
  compile_cache.apply(cfg.compilation_cache, 1)
  mesh_lib.emulate_cpu_devices(1)
  source = sources.open_source(cfg.dataset)
  meta = source.meta
  loops = {}
  with os.fdopen(spec['results_fd'], 'w') as results:
    try:
      result = planner.measure_one_device(
          cfg, source, meta, probe.Target(**spec['target']), spec['batches'],
          [(label, tuples(overrides)) for label, overrides in spec['timed']],
          time.perf_counter() + spec['seconds'], log=lambda line: print(line, flush=True),
          devices=spec.get('devices', 1), large=spec.get('large', 0), keep=loops)
      with open(spec['out'], 'w') as f:
        json.dump(result, f)
      serve(loops, sys.stdin, results)
    finally:
      for loop in loops.values():
        loop.close()


def serve(loops: dict, asked, results) -> None:
  """'done' on `results` where there are no `loops` ({label: a warm loop}); else 'serving',
  then for each JSON line [label, steps] read from `asked`, that loop's seconds a step over
  `steps` more steps, a line each, until `asked` ends."""
  results.write('serving\n' if loops else 'done\n')
  results.flush()
  if not loops:
    return
  for line in asked:
    label, steps = json.loads(line)
    results.write(f'{loops[label](steps)!r}\n')
    results.flush()


if __name__ == '__main__':
  main(sys.argv[1])
