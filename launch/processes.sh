# Sourced by the launch scripts.

# workdir_of ARG...: the DIR of --workdir DIR or --workdir=DIR; fails if there is none.
workdir_of() {
  local prev="" arg
  for arg in "$@"; do
    case $arg in --workdir=*) echo "${arg#--workdir=}"; return 0;; esac
    if [ "$prev" = --workdir ]; then echo "$arg"; return 0; fi
    prev=$arg
  done
  echo "$0: --workdir is required" >&2
  return 1
}

# forward_stop_signals PID...: SIGTERM or SIGINT sent to this script (a scheduler's stop,
# Ctrl-C) goes on to each process: every one then saves the step in flight and exits with
# status 75 (jaxpar.preemption).
forward_stop_signals() {
  _stop_pids=("$@")
  trap 'kill -TERM "${_stop_pids[@]}" 2>/dev/null || true' TERM
  trap 'kill -INT "${_stop_pids[@]}" 2>/dev/null || true' INT
}

# wait_all WORKDIR PID...: waits for the processes (PID i = process i), names each that
# failed and how; returns 1 if any did, 75 if every one that stopped early saved its step
# on a stop signal (run the same command to resume), 0 if all finished.
wait_all() {
  local workdir=$1 status=0 i=0 code why pid
  shift
  for pid in "$@"; do
    while true; do
      wait "$pid" && code=0 || code=$?
      # A signal trapped by this script interrupts `wait` (status > 128) while the process runs on.
      if ((code > 128)) && kill -0 "$pid" 2>/dev/null; then continue; fi
      break
    done
    if ((code == 75)); then
      echo "$0: process $i stopped on a signal after saving a checkpoint; its log: $workdir/process_$i.log" >&2
      ((status == 0)) && status=75
    elif ((code != 0)); then
      if ((code > 128)); then why="killed by signal $((code - 128))"
      elif ((code == 3)); then why="stopped because another process was lost"
      else why="exit status $code"; fi
      echo "$0: process $i failed ($why); its log: $workdir/process_$i.log" >&2
      status=1
    fi
    i=$((i + 1))
  done
  return $status
}
