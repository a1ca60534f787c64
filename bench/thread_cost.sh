#!/usr/bin/env bash
# The extender worker's CPU and voluntary context switches, thread by thread, over each burst
# of bench/sched_throughput.py (issue 16: where the CPU a pod goes, and how often each thread
# wakes for it). Reads /proc/<worker>/task/<tid>/{stat,status} when each burst's kube-scheduler
# starts and until it stops, and the extender's /metrics at the end (requests, connections,
# bind waits). Thread names come from `py-spy dump` when py-spy is on PATH (Python does not
# name its OS threads); otherwise only thread ids are printed.
#
#   JOULESCHED_K8S_BIN_DIR=~/.cache/joulesched/k8s/v1.37.2/bin \
#     bench/thread_cost.sh OUT --nodes 100 --rounds 1 --pods 2000 --qps 5000 --pct 100 --contenders names
#
# Writes OUT.{txt,json,log} (sched_throughput's) and OUT.threads.txt. Not a timed test.
set -euo pipefail
out=$1
shift
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
python=${PYTHON:-python}
"$python" bench/sched_throughput.py "$@" --out "$out" >"$out.log" 2>&1 &
bench=$!
worker="" master=""
for _ in $(seq 1200); do
  master=$(pgrep -f "joulesched extender --config /tmp/joulesched-sched-bench" | head -1 || true)
  [ -n "$master" ] && worker=$(pgrep -P "$master" | head -1 || true)
  [ -n "$worker" ] && break
  sleep 0.5
done
[ -n "$worker" ] || { echo "no extender worker appeared; see $out.log" >&2; wait "$bench"; exit 1; }
snap() { # tid voluntary nonvoluntary cpu-ticks, for each thread of the worker
  for t in /proc/"$worker"/task/*; do
    [ -r "$t/status" ] || continue
    echo "${t##*/} $(awk '/^voluntary_ctxt/{v=$2} /^nonvoluntary_ctxt/{n=$2} END{print v, n}' "$t/status") $(awk '{print $14+$15}' "$t/stat")"
  done 2>/dev/null | sort
}
port=$(tr '\0' ' ' </proc/"$master"/cmdline | grep -o '127.0.0.1:[0-9]*' | head -1)
: >"$out.threads.txt"
seen=""
while kill -0 "$bench" 2>/dev/null; do
  sched=$(pgrep -f "kube-scheduler.*joulesched-sched-bench" | head -1 || true)
  if [ -n "$sched" ] && [ "$sched" != "$seen" ] && [ -d /proc/"$worker" ]; then
    seen=$sched
    before=$(snap)
    names=""
    if command -v py-spy >/dev/null; then
      sleep 1
      names=$(py-spy dump -p "$worker" 2>/dev/null | sed -n 's/^Thread \([0-9]*\) ([a-z]*): "\(.*\)"$/\1 \2/p' | sort || true)
    fi
    after=$before metrics=""
    while kill -0 "$sched" 2>/dev/null; do
      after=$(snap)
      metrics=$(curl -s "http://$port/metrics" | grep -E '^joulesched_extender_(requests_total\{code="200"|connections_total|bind_waits_total)' || true)
      sleep 0.2
    done
    {
      echo "# burst of kube-scheduler $sched ($(date -u +%H:%M:%S) UTC): thread, voluntary and involuntary switches, CPU s"
      join -a2 -e0 -o 2.1,1.2,1.3,1.4,2.2,2.3,2.4 <(echo "$before") <(echo "$after") |
        awk '{printf "%s %d %d %.2f\n", $1, $5-$2, $6-$3, ($7-$4)/100}' |
        join -a1 - <(echo "$names") | awk '$4 > 0 || $2 > 50'
      echo "$metrics"
    } >>"$out.threads.txt"
  fi
  sleep 0.2
done
wait "$bench"
cat "$out.threads.txt"
