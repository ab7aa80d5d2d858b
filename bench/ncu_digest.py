#!/usr/bin/env python3
"""bench/ncu_digest.py — one line per kernel launch of an Nsight Compute CSV (`ncu --csv --page details`).

Each line: the launch's time, DRAM and SM throughput (% of peak), achieved and theoretical occupancy, warps issued
per scheduler cycle, registers, and its three longest stall reasons (warps stalled per issued instruction, where
bench/gpu_session.sh's profile step asked for the smsp__average_warps_issue_stalled_* metrics).
The CSV starts with the profiled program's own output; ncu's rows begin at the "ID" header line.

    python3 bench/ncu_digest.py ncu_norms.csv
"""
import collections
import csv
import sys

WANT = {"Duration": "dur", "DRAM Throughput": "dram%", "Compute (SM) Throughput": "sm%",
        "Achieved Occupancy": "occ%", "Theoretical Occupancy": "theo%", "Issued Warp Per Scheduler": "issue",
        "Registers Per Thread": "regs"}
STALL = "smsp__average_warps_issue_stalled_"


def launches(path):
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"ncu_digest.py: no ncu rows in {path}")
    per = collections.OrderedDict()
    for r in csv.DictReader(line for line in lines[start:] if line.startswith('"')):
        m = per.setdefault((r["ID"], r["Kernel Name"]), {"grid": r["Grid Size"], "block": r["Block Size"], "stalls": {}})
        name, value = r["Metric Name"], r["Metric Value"]
        if name in WANT:
            m[WANT[name]] = value + (" " + r["Metric Unit"] if name == "Duration" else "")
        elif name.startswith(STALL):
            m["stalls"][name[len(STALL):].split("_per_issue_active")[0]] = float(value.replace(",", "") or 0)
    return per


def main():
    for (i, kernel), m in launches(sys.argv[1]).items():
        top = sorted(m["stalls"].items(), key=lambda kv: -kv[1])[:3]
        print(f"  {i:>4} {kernel[:80]:<80} grid={m['grid']} block={m['block']} " +
              " ".join(f"{n}={m.get(n, '?')}" for n in WANT.values()) +
              (" stalls: " + ", ".join(f"{n} {v:.2f}" for n, v in top) if top else ""))


if __name__ == "__main__":
    main()
