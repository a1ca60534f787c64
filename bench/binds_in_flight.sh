#!/usr/bin/env bash
# The bindings joulesched's bind verb has in flight during each burst of
# bench/sched_throughput.py: the extender the burst's kube-scheduler calls (the port of its
# config's urlPrefix) has its /metrics read every 0.1 s while that kube-scheduler runs, and
# joulesched_extender_binds_in_flight is summed over its workers. Each read is a connection
# and a little CPU of the extender's: the bursts run a little slower than without it.
#
#   JOULESCHED_K8S_BIN_DIR=~/.cache/joulesched/k8s/v1.37.2/bin PYTHON=.venv/bin/python \
#     bench/binds_in_flight.sh /tmp/bif --nodes 100 --rounds 2 --qps 5000 --pct 100 --contenders names,nowait
#
# Writes OUT.{txt,json,log} (sched_throughput's) and OUT.inflight.txt: per burst, how many
# reads saw each count, and the largest. Not a timed test.
. "$(dirname "$0")/bursts.sh"
start_bench "$@"
: >"$out.inflight.txt"
burst() { # kube-scheduler, the extender's port, its gunicorn master
  local sched=$1 calls=$2 samples="" n
  while kill -0 "$sched" 2>/dev/null; do
    n=$(curl -s -m 1 "http://127.0.0.1:$calls/metrics" | awk '/^joulesched_extender_binds_in_flight/{s+=$2; seen=1} END{if (seen) print s}' || true)
    [ -n "$n" ] && samples="$samples $n"
    sleep 0.1
  done
  {
    echo "# burst of kube-scheduler $sched ($(date -u +%H:%M:%S) UTC), extender on port $calls: binds in flight, reads"
    echo "$samples" | tr ' ' '\n' | sed '/^$/d' | sort -n | uniq -c | awk '{printf "%s:%s ", $2, $1} END{print ""}'
    echo "$samples" | tr ' ' '\n' | sed '/^$/d' | sort -n | tail -1 | sed 's/^/# largest: /'
  } >>"$out.inflight.txt"
}
each_burst "$bench" "$out.inflight.txt" burst
wait "$bench"
trap - EXIT
cat "$out.inflight.txt"
