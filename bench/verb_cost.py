"""CPU per pod of the extender's filter and prioritize, in process, at N candidate names.

The extender's app (extender/app.py) with deploy/'s extender config, its profiles from a file
of N nodes (``joulesched bench``'s synthetic SPECpower-like curves), no bind verb and no
watches; each pod's filter and then prioritize are sent to the verb endpoint the worker calls
(``VerbEndpoint``), every node named, in another order for each pod, as kube-scheduler sends
them in names mode. The process
CPU (``time.process_time``) over ``--pods`` pods, after 200 unmeasured, is printed per pod:
the request's parse, the policy, the reply's encoding and the metrics, without HTTP. Not a
timed test: run by hand, alternating checkouts for an A/B (``PYTHONPATH=<checkout>``), and
record the figures in docs/benchmarks.md.

    PYTHONPATH=. python bench/verb_cost.py --nodes 100,1000,5000 --pods 2000
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

import joulesched
from joulesched.extender.app import create_app
from joulesched.extender.bench import node_name, profile_document
from joulesched.extender.config import load_config

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 200
ORDERS = 50


def pod(i: int) -> dict[str, object]:
    return {
        "metadata": {"name": f"p{i}", "namespace": "default", "uid": f"u{i}"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]},
    }


def verb_endpoint(n: int, work: Path) -> Any:
    """The verb endpoint of deploy/'s extender config over a profile file of ``n`` nodes in
    ``work``: no bind verb, no watches."""
    (work / "nodes.yaml").write_text(yaml.safe_dump(profile_document(n)))
    config = yaml.safe_load((ROOT / "deploy" / "extender" / "config.yaml").read_text())
    config["profiles"] = {"source": "file", "file": {"path": str(work / "nodes.yaml")}}
    config["bind"] = {"enabled": False}
    config["predicted_load"]["watch_pods"] = False
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    return create_app(load_config(str(work / "config.yaml")), background=False).extensions["joulesched"]["endpoint"]


def node_orders(n: int) -> list[list[str]]:
    """kube-scheduler lists the nodes that passed its filters in the order its parallel checks
    finished, a different order pod after pod: ``ORDERS`` orders of the ``n`` names, taken in turn."""
    rng = random.Random(1)
    return [rng.sample([node_name(i) for i in range(n)], n) for _ in range(ORDERS)]


def cost(n: int, pods: int, work: Path) -> float:
    """CPU seconds a pod of filter + prioritize over ``n`` names."""
    endpoint = verb_endpoint(n, work)
    orders = node_orders(n)
    bodies = [orjson.dumps({"Pod": pod(i), "NodeNames": orders[i % ORDERS]}) for i in range(WARM_UP + pods)]

    def run(lo: int, hi: int) -> None:
        for body in bodies[lo:hi]:
            for verb in ("filter", "prioritize"):
                status, reply = endpoint(verb, len(body), lambda _size, b=body: b)
                if status != 200:
                    raise SystemExit(f"{verb} at {n} names: HTTP {status}: {reply[:300]!r}")

    run(0, WARM_UP)
    started = time.process_time()
    run(WARM_UP, WARM_UP + pods)
    return (time.process_time() - started) / pods


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="100,1000,5000", help="candidate counts, e.g. 100,1000")
    p.add_argument("--pods", type=int, default=2000, help="measured pods a count (after 200 unmeasured)")
    args = p.parse_args()
    counts = [int(c) for c in args.nodes.split(",") if c]
    if not counts or min(counts) < 1 or args.pods < 1:
        p.error("--nodes needs counts of 1 or more, --pods 1 or more")
    code = Path(joulesched.__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="joulesched-verb-cost-") as tmp:
        for n in counts:
            work = Path(tmp) / str(n)
            work.mkdir()
            print(f"{code}: {n} names: filter + prioritize {cost(n, args.pods, work) * 1e6:.0f} us of CPU a pod", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
