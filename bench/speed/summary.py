#!/usr/bin/env python3
"""bench/speed/summary.py OUT ROUNDS MESSAGES [RATE]: the medians of bench/speed/run.sh's rounds.

Reads OUT/r<k>/maildir/{pepsi,postfix}.json and .pss, OUT/r<k>/relay/{side}-{1,10}rcpt.json
and, when RATE (the open-loop rate) is above 0, OUT/r<k>/maildir-open/{side}.json and
OUT/r<k>/relay-open/{side}-1rcpt.json (as bench/e2e/run.sh and bench/relay/run.sh write
them) and prints, per path, each side's median msg/s, p99 (250 to delivery), CPU per message
and memory, and the ratios.
"""
import json
import os
import sys
from statistics import median

POSTFIX = {"master", "smtpd", "cleanup", "qmgr", "virtual", "smtp", "trivial-rewrite",
           "postlogd", "anvil", "proxymap", "scache", "tlsmgr", "pickup", "bounce"}


def cpu_ms(record, side, n):
    """CPU ms per message of the side's own processes (PostgreSQL counts for Pepsi)."""
    cpu = record.get("cpu", {}).get("cpu", {})
    if side == "pepsi":
        own = [v for k, v in cpu.items() if k.startswith("pepsi-") or k == "postgres"]
    else:
        own = [v for k, v in cpu.items() if k in POSTFIX]
    return sum(own) / n * 1000


def main(out, rounds, n, rate):
    paths = {"Maildir": ("maildir", "{side}.json"),
             "relay, 1 recipient": ("relay", "{side}-1rcpt.json"),
             "relay, 10 recipients": ("relay", "{side}-10rcpt.json")}
    if rate > 0:
        paths[f"Maildir, {rate}/s"] = ("maildir-open", "{side}.json")
        paths[f"relay 1 rcpt, {rate}/s"] = ("relay-open", "{side}-1rcpt.json")
    print(f"\n{n} messages a run, medians of {rounds} rounds")
    print(f"{'path':22} | {'side':7} | {'msg/s':>6} | {'p99 ms':>7} | {'CPU ms/msg':>10} | memory MiB")
    for path, (sub, name) in paths.items():
        med = {}
        for side in ("pepsi", "postfix"):
            rows = []
            for r in range(1, rounds + 1):
                p = os.path.join(out, f"r{r}", sub, name.format(side=side))
                if os.path.exists(p):
                    rec = json.load(open(p))
                    mem = None
                    pss = os.path.join(out, f"r{r}", sub, f"{side}.pss")
                    if sub == "maildir" and os.path.exists(pss):
                        f = [int(x) for x in open(pss).read().split()]
                        # Pepsi: own processes + its PostgreSQL backends; Postfix: its daemons.
                        mem = (f[0] + (f[2] if side == "pepsi" else 0)) / 1024
                    rows.append((rec["msg_per_s"], rec["p99_ms"], cpu_ms(rec, side, n), mem,
                                 rec["delivered"] == rec["sent"]))
            if not rows:
                continue
            mems = [m for _, _, _, m, _ in rows if m is not None]
            med[side] = (median(r[0] for r in rows), median(r[1] for r in rows),
                         median(r[2] for r in rows), median(mems) if mems else None,
                         sum(1 for r in rows if not r[4]))
            rate, p99, cpu, mem, short = med[side]
            memtext = f"{mem:.1f}" if mem is not None else "-"
            lost = f" ({short} round(s) not all delivered)" if short else ""
            print(f"{path:22} | {side:7} | {rate:6.0f} | {p99:7.0f} | {cpu:10.2f} | {memtext}{lost}")
        if len(med) == 2:
            a, b = med["pepsi"], med["postfix"]
            text = (f"  ratio: rate {a[0] / b[0]:.2f}x, p99 {a[1] / b[1]:.2f}x, "
                    f"CPU {a[2] / b[2]:.2f}x")
            if a[3] and b[3]:
                text += f", memory {a[3] / b[3]:.2f}x"
            print(text)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
         int(sys.argv[4]) if len(sys.argv) == 5 else 0)
