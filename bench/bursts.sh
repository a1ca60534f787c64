# Shell functions for the scripts that watch bench/sched_throughput.py's bursts
# (thread_cost.sh, binds_in_flight.sh); sourced, not run.
set -euo pipefail
export LC_ALL=C

# start_bench OUT ARGS...: sets $out to OUT made absolute, moves to the repository's root and
# starts bench/sched_throughput.py ARGS --out OUT in the background (its output in OUT.log),
# with $PYTHON (default: python, a relative path taken from the root); sets $bench to its pid,
# killed on exit.
start_bench() {
  out=$(realpath -m "${1:?usage: ${0##*/} OUT [sched_throughput.py arguments]}")
  shift
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  PYTHONPATH=$PWD "${PYTHON:-python}" bench/sched_throughput.py "$@" --out "$out" >"$out.log" 2>&1 &
  bench=$!
  trap 'kill "$bench" 2>/dev/null || true' EXIT
}

# "PORT MASTER" of the joulesched extender kube-scheduler $1 calls, by the port of its config's
# urlPrefix (several extenders may be running at once), or nothing (a const or alone burst).
burst_extender() {
  local conf calls master
  conf=$(tr '\0' '\n' </proc/"$1"/cmdline 2>/dev/null | sed -n 's/^--config=//p' || true)
  calls=$([ -r "$conf" ] && grep -o 'urlPrefix: *http://127.0.0.1:[0-9]*' "$conf" | grep -o '[0-9]*$' | head -1 || true)
  master=$([ -n "$calls" ] && pgrep -f "joulesched extender --config /tmp/joulesched-sched-bench.*127.0.0.1:$calls( |$)" | head -1 || true)
  if [ -n "$master" ]; then
    echo "$calls $master"
  fi
}

# each_burst BENCH FILE FN: while process BENCH runs, for each burst's kube-scheduler as it
# starts, `FN SCHED PORT MASTER` (FN returns once that kube-scheduler has stopped); a burst
# whose kube-scheduler calls no joulesched extender gets a line in FILE instead.
each_burst() {
  local bench=$1 file=$2 fn=$3 seen="" sched calls master
  while kill -0 "$bench" 2>/dev/null; do
    sched=$(pgrep -f "kube-scheduler.*joulesched-sched-bench" | head -1 || true)
    if [ -z "$sched" ] || [ "$sched" = "$seen" ]; then
      sleep 0.2
      continue
    fi
    seen=$sched
    calls="" master=""
    read -r calls master <<<"$(burst_extender "$sched")" || true
    if [ -z "$master" ]; then
      echo "# burst of kube-scheduler $sched: no joulesched extender running (a const or alone burst)" >>"$file"
      continue
    fi
    "$fn" "$sched" "$calls" "$master"
  done
}
