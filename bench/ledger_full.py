"""What recording a placement costs once the predicted-load ledger is full.

A ledger of ``--size`` placements over 100 nodes (``max_pods`` = ``--size``), then ``--records``
more, each of which makes it forget its oldest; the wall time a record is printed. Not a timed
test: run by hand, with ``PYTHONPATH=<checkout>`` for an A/B, and record the figures in
docs/benchmarks.md.

    PYTHONPATH=. python bench/ledger_full.py --size 100000 --records 200
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import joulesched
from joulesched.extender.predicted import PredictedLoad


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=100_000, help="placements the ledger holds (its max_pods)")
    p.add_argument("--records", type=int, default=200, help="placements recorded past that, timed")
    args = p.parse_args()
    ledger = PredictedLoad(ttl_seconds=1e9, settle_seconds=45, max_pods=args.size)
    index = {f"node-{i}": i for i in range(100)}
    ledger.per_row(index, np.full(100, np.nan), 0.0)
    for i in range(args.size):
        ledger.record(f"uid-{i}", f"node-{i % 100}", 0.1, 0.0, float(i), confirmed=True)
    start = time.perf_counter()
    for i in range(args.size, args.size + args.records):
        ledger.record(f"uid-{i}", f"node-{i % 100}", 0.1, 0.0, float(i), confirmed=True)
    took = (time.perf_counter() - start) / args.records
    print(f"{joulesched.__path__[0]}: {took * 1e6:.1f} us a record, the ledger full at {len(ledger):,} placements")


if __name__ == "__main__":
    main()
