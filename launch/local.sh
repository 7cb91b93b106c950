#!/usr/bin/env bash
# Run jaxpar.train (or another jaxpar tool) as N processes on this machine, one mesh
# across all of them (jax.distributed over loopback; gloo collectives on CPU). Process i
# is pinned to core i mod nproc with taskset, so the processes really run concurrently.
#
#   launch/local.sh N --config configs/resnet34_2d.py --workdir /tmp/run [--config.key=value ...]
#   launch/local.sh N --module analysis.benchmarks.bench --workdir /tmp/bench --config ... [--torch]
#
# --module: the Python module every process runs (default jaxpar.train); --workdir is
# passed on to jaxpar.train only. Each process emulates (mesh devices / N) CPU devices.
# Logs: WORKDIR/process_<i>.log; process 0's output is also shown. Exits non-zero if any
# process fails, naming it. If one dies, the others stop within
# --config.distributed.heartbeat_timeout seconds (exit status 3); run the same command
# again to resume from the last checkpoint. SIGTERM or SIGINT (Ctrl-C) to this script or to
# any process: all save the same step and exit with status 75 (so does this script).
set -euo pipefail
. "$(dirname "$0")/processes.sh"
if [ $# -lt 1 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 NUM_PROCESSES [--module M] --workdir DIR --config FILE [flags ...]" >&2
  exit 2
fi
n=$1; shift
module=jaxpar.train
if [ "${1:-}" = "--module" ]; then
  module=${2:?--module needs a module name}; shift 2
fi
workdir=$(workdir_of "$@") || exit 2
prev="" args=()
for arg in "$@"; do  # only jaxpar.train takes --workdir
  if [ "$module" = jaxpar.train ] || ! { [ "$arg" = --workdir ] || [[ $arg == --workdir=* ]] \
      || [ "$prev" = --workdir ]; }; then
    args+=("$arg")
  fi
  prev=$arg
done
mkdir -p "$workdir"
port=${JAXPAR_PORT:-$((20000 + RANDOM % 20000))}
cores=$(nproc)
pids=()
for ((i = 0; i < n; i++)); do
  cmd=(taskset -c $((i % cores)) "${PYTHON:-python}" -m "$module" "${args[@]}"
       --config.distributed.coordinator="127.0.0.1:$port"
       --config.distributed.num_processes="$n" --config.distributed.process_id="$i")
  if [ "$i" -eq 0 ]; then  # shown and logged; $! is python's pid, not tee's
    "${cmd[@]}" > >(tee "$workdir/process_0.log") 2>&1 &
  else
    "${cmd[@]}" > "$workdir/process_$i.log" 2>&1 &
  fi
  pids+=($!)
done
forward_stop_signals "${pids[@]}"
wait_all "$workdir" "${pids[@]}"
