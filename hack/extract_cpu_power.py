"""Build measurement/data/cpu_power.csv from the public tables (see measurement/data/README.md).

python hack/extract_cpu_power.py ../shared/data/power measurement/data/cpu_power.csv
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from joulesched.measurement.estimate import model_key


def main(src: Path, out: Path) -> None:
    rows: dict[str, dict[str, str]] = {}
    with open(src / "codecarbon_cpu_power.csv", newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            key = model_key(r["Name"])
            try:
                tdp = float(r["TDP"])
            except ValueError:  # a few malformed values ("27.29.5"): left out
                continue
            if key and key not in rows and tdp > 0:
                rows[key] = {"key": key, "model": r["Name"].strip(), "tdp_watts": f"{tdp:g}"}
    spec: dict[str, list[tuple[float, int]]] = {}
    with open(src / "ccf_SPECpower-2026-03-09.csv", newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            try:
                watts, threads, chips = float(r["avg. watts @ 100%"]), int(r["Total Threads"]), int(r["Chips"])
            except ValueError:
                continue
            key = model_key(r["CPU Description"])
            if key and threads > 0 and chips > 0 and watts > 0:
                spec.setdefault(key, []).append((watts / threads, threads // chips))
    for key, results in spec.items():
        row = rows.setdefault(key, {"key": key, "model": "", "tdp_watts": ""})
        row["threads_per_chip"] = str(statistics.median_low(t for _, t in results))
        row["specpower_results"] = str(len(results))
        row["specpower_watts_per_thread"] = f"{statistics.median(w for w, _ in results):.4f}"
    fields = ["key", "model", "tdp_watts", "threads_per_chip", "specpower_results", "specpower_watts_per_thread"]
    with open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fields, lineterminator="\n")
        writer.writeheader()
        for key in sorted(rows):
            writer.writerow({k: rows[key].get(k, "") for k in fields})
    print(f"{out}: {len(rows)} models, {len(spec)} with SPECpower results")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
