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

# wait_all WORKDIR PID...: waits for the processes (PID i = process i), names each that
# failed and how; returns 1 if any did.
wait_all() {
  local workdir=$1 status=0 i=0 code why pid
  shift
  for pid in "$@"; do
    wait "$pid" && code=0 || code=$?
    if ((code != 0)); then
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
