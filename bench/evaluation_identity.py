"""Whether two checkouts' policy evaluations agree bit for bit, over a random corpus.

A change meant to make ``policy.scoring.evaluate`` cheaper must not change one bit of what
it answers. This builds the same seeded corpus from whichever checkout runs it — node sets of
1 to 120 profiles, with and without GPUs, unknown, stale and power-capped nodes, predicted
load, held nodes, every strategy, scale and idle-power setting, CPU and GPU pods — evaluates
each case and writes every field of each ``Evaluation`` (and what ``top``, ``best``, ``kept``
and ``passed`` make of it) to a file; ``--compare`` then evaluates the corpus again and
reports every array whose bytes differ from the file's (a NaN is compared by its bits too).

    cd ../previous && PYTHONPATH=. python bench/evaluation_identity.py --write /tmp/evaluations.pkl
    PYTHONPATH=. python bench/evaluation_identity.py --compare /tmp/evaluations.pkl

Not a test: it compares two versions of the code, which a test of one checkout cannot hold.
"""

from __future__ import annotations

import argparse
import pickle
import random
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from joulesched.policy.config import PolicyConfig
from joulesched.policy.demand import PodDemand
from joulesched.policy.profile import GpuProfile, NodeArrays, NodeProfile
from joulesched.policy.scoring import evaluate

CURVES = (
    (56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268),
    (127, 198, 226, 253, 281, 314, 354, 405, 464, 576, 619),
    (63.8, 99.6, 113, 128, 150, 163, 173, 182, 193, 203, 224),
    (50.0, 50.0, 50.0, 50.0, 50.0, 50.0, 50.0, 50.0, 50.0, 50.0, 50.0),  # flat: a cheapest cost of 0
)
NOW = 10_000.0


def profile(rng: random.Random, i: int, gpus: bool) -> NodeProfile:
    curve = tuple(float(w) * rng.uniform(0.8, 1.2) for w in rng.choice(CURVES))
    return NodeProfile(
        name=f"n{i}",
        cores=float(rng.choice((8, 16, 64, 128))),
        power_curve_watts=curve,
        speed=rng.choice((1.0, rng.uniform(0.5, 2.0))),
        utilisation=rng.choice((0.0, rng.random(), 0.98, 1.2)),
        measured_watts=rng.choice((None, rng.uniform(50, 700))),
        power_cap_watts=rng.choice((None, None, rng.uniform(150, 800))),
        updated=rng.choice((None, NOW - rng.uniform(0, 100), NOW - 500.0)),
        gpus=GpuProfile(count=rng.choice((1, 4, 8)), idle_watts=60.0, max_watts=rng.uniform(300, 700)) if gpus and rng.random() < 0.4 else None,
        pue=rng.uniform(1.05, 1.6),
        carbon_intensity=rng.choice((0.0, rng.uniform(20, 900))),
        idle_power=rng.choice(("", "", "always-on", "autoscaled", "power-managed")),
        held_until=rng.choice((None, 0.0, NOW + rng.uniform(-100, 20_000))),
    )


def corpus(cases: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for _ in range(cases):
        n = rng.choice((1, 2, 3, 5, 10, 40, 100, 120))
        gpus = rng.random() < 0.4
        nodes = NodeArrays.build([profile(rng, i, gpus) for i in range(n)])
        m = rng.choice((1, n, max(1, n // 2), n + 2))
        rows = np.array([rng.randrange(n) if rng.random() > 0.1 else -1 for _ in range(m)], dtype=np.intp)
        if rng.random() < 0.5 and m == n:
            rows = np.array(rng.sample(range(n), n), dtype=np.intp)  # every node, in another order
        cfg = PolicyConfig(
            strategy=rng.choice(("energy", "carbon")),
            band=rng.choice((0.5, 0.2, 1.0)),
            neutral_score=rng.choice((5, 0)),
            max_age_seconds=rng.choice((120.0, 600.0)),
            avoid_saturation=rng.random() < 0.8,
            idle_power=rng.choice(("always-on", "autoscaled", "power-managed")),
            score_scale=rng.choice(("request", "cluster")),
            reserve_gpu_nodes=rng.random() < 0.7,
            filter_keeps=rng.choice(("all", "top", "best")),
            power_cap_enabled=rng.random() < 0.7,
        )
        pod = PodDemand(
            cpu_cores=rng.choice((0.0, 0.1, 2.0, 16.0, 200.0)),
            gpus=rng.choice((0, 0, 0, 1, 4)),
            runtime_seconds=rng.choice((None, 60.0, 36_000.0)),
        )
        predicted = rng.random() < 0.6
        out.append(
            {
                "nodes": nodes,
                "rows": rows,
                "pod": pod,
                "cfg": cfg,
                "now": NOW,
                "predicted_cores": np.array([rng.choice((0.0, 0.0, 2.0, 40.0)) for _ in range(n)]) if predicted else None,
                "predicted_gpus": np.array([rng.choice((0.0, 0.0, 1.0)) for _ in range(n)]) if predicted else None,
                "held_until": np.array([rng.choice((np.nan, 0.0, NOW + 50.0, np.inf)) for _ in range(n)]) if rng.random() < 0.3 else None,
            }
        )
    return out


def answers(cases: list[dict[str, Any]]) -> list[dict[str, bytes | None]]:
    """Each case's evaluation as bytes: every field, and what its methods make of it."""
    out = []
    for case in cases:
        ev = evaluate(**case)
        cfg = case["cfg"]
        got: dict[str, bytes | None] = {f.name: _bits(getattr(ev, f.name)) for f in fields(ev)}
        top = ev.top()
        got["top()"] = None if top is None else _bits(top)
        got["best()"] = repr(ev.best()).encode()
        got["kept(cfg)"] = _bits(ev.kept(cfg))
        keep, passed = ev.passed()
        got["passed()"] = _bits(keep) + b"".join(_bits(getattr(passed, f.name)) for f in fields(passed))
        out.append(got)
    return out


def _bits(values: np.ndarray) -> bytes:
    a = np.asarray(values)
    return str(a.dtype).encode() + str(a.shape).encode() + a.tobytes()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", type=Path, help="write this checkout's answers here")
    what.add_argument("--compare", type=Path, help="compare this checkout's answers with the file's")
    p.add_argument("--cases", type=int, default=5000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    got = answers(corpus(args.cases, args.seed))
    if args.write:
        args.write.write_bytes(pickle.dumps({"cases": args.cases, "seed": args.seed, "answers": got}))
        print(f"{len(got)} evaluations written to {args.write}")
        return 0
    kept = pickle.loads(args.compare.read_bytes())
    if (kept["cases"], kept["seed"]) != (args.cases, args.seed):
        p.error(f"{args.compare} holds {kept['cases']} cases of seed {kept['seed']}: pass --cases and --seed to match")
    differ = [(i, key) for i, (a, b) in enumerate(zip(kept["answers"], got, strict=True)) for key in a if a[key] != b.get(key)]
    for i, key in differ[:20]:
        print(f"case {i}: {key} differs")
    print(f"{len(got)} evaluations, {len(differ)} differing arrays")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
