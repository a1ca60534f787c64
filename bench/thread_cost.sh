#!/usr/bin/env bash
# The extender workers' CPU and context switches, thread by thread, over each burst of
# bench/sched_throughput.py (where the CPU a pod goes, and how often each thread
# wakes for it). The extender is the one that burst's kube-scheduler calls (the port of its
# config's urlPrefix); every gunicorn worker of it is read, as kube-scheduler's connections
# may reach either. Reads /proc/<worker>/task/<tid>/{stat,status} when each burst's
# kube-scheduler starts and until it stops, and the extender's /metrics then (requests,
# connections and bind waits: totals since that extender started, one per --nodes value).
# Thread names come from `py-spy dump` when py-spy is on PATH (Python does not name its OS
# threads); otherwise only thread ids are printed. Only joulesched's contenders have a worker.
#
#   JOULESCHED_K8S_BIN_DIR=~/.cache/joulesched/k8s/v1.37.2/bin PYTHON=.venv/bin/python \
#     bench/thread_cost.sh /tmp/tc --nodes 100 --rounds 1 --pods 2000 --qps 5000 --pct 100 --contenders names
#
# Writes OUT.{txt,json,log} (sched_throughput's) and OUT.threads.txt. Not a timed test.
. "$(dirname "$0")/bursts.sh"
start_bench "$@"
tick=$(getconf CLK_TCK)
snap() { # worker/tid voluntary involuntary cpu-ticks, for each thread of each process named
  for t in $(for p in "$@"; do echo /proc/"$p"/task/*; done); do
    [ -r "$t/status" ] || continue
    p=${t#/proc/} p=${p%%/*}
    echo "$p/${t##*/} $(awk '/^voluntary_ctxt/{v=$2} /^nonvoluntary_ctxt/{n=$2} END{print v, n}' "$t/status") $(sed 's/.*) //' "$t/stat" | awk '{print $12+$13}')"
  done 2>/dev/null | sort -k1,1
}
: >"$out.threads.txt"
burst() { # kube-scheduler, the extender's port, its gunicorn master
  local sched=$1 calls=$2 workers before names after metrics
  workers=$(pgrep -P "$3" | paste -sd' ' || true)
  if [ -z "$workers" ]; then
    echo "# burst of kube-scheduler $sched: no joulesched worker running" >>"$out.threads.txt"
    return
  fi
  before=$(snap $workers)
  names=""
  if command -v py-spy >/dev/null; then
    sleep 1
    names=$(for w in $workers; do
      py-spy dump -p "$w" 2>/dev/null | sed -n "s|^Thread \([0-9]*\) ([a-z+]*): \"\(.*\)\"\$|$w/\1 \2|p" || true
    done | sort -k1,1)
  fi
  after=$before
  while kill -0 "$sched" 2>/dev/null; do
    after=$(snap $workers)
    sleep 0.2
  done
  # once, after the burst: each read is a connection of its own
  metrics=$(curl -s "http://127.0.0.1:$calls/metrics" | grep -E '^joulesched_extender_(requests_total\{code="200"|connections_total|bind_waits_total)' || true)
  {
    echo "# burst of kube-scheduler $sched ($(date -u +%H:%M:%S) UTC), gunicorn workers $workers: worker/thread, voluntary and involuntary switches, CPU s"
    join -a2 -e0 -o 2.1,1.2,1.3,1.4,2.2,2.3,2.4 <(echo "$before") <(echo "$after") |
      awk -v tick="$tick" '{printf "%s %d %d %.2f\n", $1, $5-$2, $6-$3, ($7-$4)/tick}' |
      join -a1 - <(echo "$names") | awk '$4 > 0 || $2 > 50'
    echo "# the extender's totals since it started:"
    echo "$metrics"
  } >>"$out.threads.txt"
}
each_burst "$bench" "$out.threads.txt" burst
wait "$bench"
trap - EXIT
cat "$out.threads.txt"
