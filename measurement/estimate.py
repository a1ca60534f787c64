"""Energy estimated from CPU time, for machines where no energy counter can be read.

``joulesched measure`` falls back to this when no source opened (a VM without RAPL, a laptop
without root). The rule: **energy = the command's CPU seconds × the watts of one fully busy
hardware thread** of this CPU model. A busy thread is charged its whole share of the machine's
full-load power (its share of idle included); the idle of threads the command left unused is
not charged. The watts per thread, in order:

1. the median over published SPECpower_ssj2008 results for this CPU model of (watts at 100 %
   load ÷ hardware threads) — whole server at the wall (Cloud Carbon Footprint's SPECpower table);
2. the CPU's TDP ÷ its hardware threads per chip (codecarbon's TDP table; the thread count from
   SPECpower, or from ``/proc/cpuinfo`` ``siblings`` on bare metal — a VM's topology is not the host's);
3. otherwise :data:`DEFAULT_WATTS_PER_VCPU`, Cloud Carbon Footprint's mean full-load watts per
   vCPU over the AWS microarchitectures it lists, flagged as a default for an unknown CPU.

The table is ``measurement/data/cpu_power.csv`` (sources and licences in ``data/README.md``).
"""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).with_name("data") / "cpu_power.csv"
# Mean of "Max Watts" over the 20 microarchitectures of ccf-coefficients-aws-use.csv
# (cloud-carbon-footprint/ccf-coefficients @ b0032d92, output/; Apache-2.0).
DEFAULT_WATTS_PER_VCPU = 3.81

# Intel's 11th-14th generation Core CPUs name themselves "13th Gen Intel(R) Core(TM) i7-1360P" in
# /proc/cpuinfo, the TDP table "Intel Core i7-1360P": the generation goes (only before "Intel":
# AMD's "6th Gen A10-8700P APU" rows keep theirs, as the table's keys do)
_DROP = re.compile(
    r"\b\d+(st|nd|rd|th)\s+gen\s+(?=intel\b)"
    r"|\(r\)|\(tm\)|®|™|\b\d+(\.\d+)?\s*ghz\b|\b\d+-core\b|\bprocessor\b|\bcpu\b|\bintel\b|\bamd\b"
)


def model_key(name: str) -> str:
    """A CPU model name reduced to what identifies it: ``Intel(R) Xeon(R) Gold 6252 CPU @ 2.10GHz``
    → ``xeongold6252``, ``13th Gen Intel(R) Core(TM) i7-1360P`` → ``corei71360p``. Empty when
    nothing model-like (no digit) is left."""
    text = name.lower().split("@")[0]
    key = re.sub(r"[^a-z0-9+]", "", _DROP.sub(" ", text))
    return key if any(c.isdigit() for c in key) else ""


@dataclass(frozen=True)
class CpuInfo:
    model: str  # as /proc/cpuinfo names it, "" when unknown
    logical_cpus: int
    threads_per_chip: int  # "siblings", 0 when absent
    virtual: bool  # the "hypervisor" flag


def read_cpuinfo(procfs_root: str | Path = "/proc") -> CpuInfo:
    """The CPU model and topology from ``<procfs_root>/cpuinfo`` (x86 and most ARM kernels)."""
    try:
        text = (Path(procfs_root) / "cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return CpuInfo("", 0, 0, False)
    model, siblings, cpus, virtual = "", 0, 0, False
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip()
        if name == "processor":
            cpus += 1
        elif name in ("model name", "hardware", "cpu model") and not model:
            model = value
        elif name == "siblings" and value.isdigit() and not siblings:
            siblings = int(value)
        elif name in ("flags", "features") and "hypervisor" in value.split():
            virtual = True
    return CpuInfo(model, cpus, siblings, virtual)


@dataclass(frozen=True)
class TableRow:
    key: str
    model: str
    tdp_watts: float | None
    threads_per_chip: int | None
    specpower_results: int
    specpower_watts_per_thread: float | None


@functools.cache
def load_table(path: str = str(TABLE)) -> dict[str, TableRow]:
    def num(text: str) -> float | None:
        return float(text) if text else None

    with open(path, newline="", encoding="utf-8") as f:
        return {
            r["key"]: TableRow(
                r["key"],
                r["model"],
                num(r["tdp_watts"]),
                int(r["threads_per_chip"]) if r["threads_per_chip"] else None,
                int(r["specpower_results"] or 0),
                num(r["specpower_watts_per_thread"]),
            )
            for r in csv.DictReader(f)
        }


@dataclass(frozen=True)
class Rate:
    """Watts of one fully busy hardware thread, and how that figure was found."""

    watts_per_thread: float
    method: str
    source: str  # "specpower" | "tdp" | "default"


def rate_for(cpu: CpuInfo, table: dict[str, TableRow] | None = None) -> Rate:
    rows = load_table() if table is None else table
    name = cpu.model or "unknown CPU"
    row = rows.get(model_key(cpu.model))
    if row is not None and row.specpower_watts_per_thread:
        return Rate(
            row.specpower_watts_per_thread,
            f"CPU time × {row.specpower_watts_per_thread:.3g} W per hardware thread of {name}: full-load watts"
            f" ÷ threads, median of {row.specpower_results} SPECpower result(s), whole server at the wall"
            " (Cloud Carbon Footprint's SPECpower table)",
            "specpower",
        )
    if row is not None and row.tdp_watts:
        threads, where = row.threads_per_chip, "SPECpower"
        if not threads and cpu.threads_per_chip and not cpu.virtual:
            threads, where = cpu.threads_per_chip, "/proc/cpuinfo"
        if threads:
            watts = row.tdp_watts / threads
            return Rate(
                watts,
                f"CPU time × TDP/threads of {name}: {row.tdp_watts:g} W / {threads} threads ({where})"
                f" = {watts:.3g} W per thread (codecarbon's TDP table)",
                "tdp",
            )
    why = "not in the table" if row is None else "in the table, but its threads per chip are unknown on a VM"
    return Rate(
        DEFAULT_WATTS_PER_VCPU,
        f"CPU time × {DEFAULT_WATTS_PER_VCPU:g} W per vCPU, Cloud Carbon Footprint's average for an unknown CPU"
        f" (default: {name!r} is {why})",
        "default",
    )


@dataclass(frozen=True)
class Estimate:
    cpu_seconds: float
    joules: float
    rate: Rate
    cpu: CpuInfo

    def as_dict(self) -> dict[str, object]:
        return {
            "cpu_seconds": self.cpu_seconds,
            "joules": self.joules,
            "watts_per_thread": self.rate.watts_per_thread,
            "source": self.rate.source,
            "method": self.rate.method,
            "cpu_model": self.cpu.model,
        }


def estimate(cpu_seconds: float, cpu: CpuInfo, table: dict[str, TableRow] | None = None) -> Estimate:
    rate = rate_for(cpu, table)
    return Estimate(cpu_seconds, max(cpu_seconds, 0.0) * rate.watts_per_thread, rate, cpu)


__all__ = [
    "DEFAULT_WATTS_PER_VCPU",
    "CpuInfo",
    "Estimate",
    "Rate",
    "estimate",
    "load_table",
    "model_key",
    "rate_for",
    "read_cpuinfo",
]
