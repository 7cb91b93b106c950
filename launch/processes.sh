# Sourced by the launch scripts: waits for the processes they started and names each
# that failed.  wait_all WORKDIR PID...  (PID i = process i; returns 1 if any failed)
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
