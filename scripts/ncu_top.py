#!/usr/bin/env python3
"""Summarises an `ncu --page source --csv --print-source sass` export: the SASS lines with the
most warp-stall samples, with their largest stall reasons. Used on the device machine (ncu is
there, not here):  ncu_top.py source.csv [rows]"""
import csv
import sys


def num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="") as f:
        lines = [l for l in f if l.strip() and not l.startswith("==")
                 and not l.startswith('"Kernel Name"')]
    rows = list(csv.DictReader(lines))
    if not rows:
        print("no rows in", path)
        return
    cols = list(rows[0].keys())
    total_col = next((c for c in cols if "Warp Stall Sampling (All" in c), None)
    if total_col is None:
        print("columns:", cols[:40])
        return
    reason_cols = [c for c in cols if c.startswith("stall_") or "Stall" in c and c != total_col
                   and "Not-issued" not in c]
    src_col = next((c for c in cols if c in ("Source", "SASS")), cols[1])
    total = sum(num(r[total_col]) for r in rows) or 1.0
    print(f"total stall samples {total:.0f}; reason columns: {len(reason_cols)}")
    # Totals per reason over the whole kernel.
    per_reason = {c: sum(num(r[c]) for r in rows) for c in reason_cols}
    for c, v in sorted(per_reason.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {v / total * 100:5.1f}%  {c}")
    print()
    for r in sorted(rows, key=lambda r: -num(r[total_col]))[:top]:
        reasons = sorted(((num(r[c]), c) for c in reason_cols), reverse=True)[:3]
        rs = ", ".join(f"{c.replace('stall_', '')} {v:.0f}" for v, c in reasons if v > 0)
        addr = r.get("Address", "")
        print(f"{num(r[total_col]) / total * 100:5.1f}%  {addr:>6}  {r[src_col][:70]:<70}  {rs}")


if __name__ == "__main__":
    main()
