#!/usr/bin/env python3
"""bench/relay/sink.py: reads what Postfix's smtp-sink received for bench/relay/run.sh.

  sink.py wait DIR --messages N [--timeout S]
  sink.py seen DIR --tag T --out FILE

smtp-sink runs with `-d DIR/%H%M%S.`: one file per mail transaction, created when the
transaction starts and written as the data arrives, so the file's modification time (ns
resolution) is when the sink had the whole message, just before its 250.

wait: returns once DIR holds N files, or after S seconds in which their number did not grow
(exit 1 then).

seen: for every file in DIR with an `X-Bench-Seq: T-<n>` header, writes
`<n> <mtime> <name>` (tab-separated) to FILE: the `seen` record that bench/e2e/e2e.py report
joins with the loader's record. Also checks each transaction's recipient count
(`X-Rcpt-Args` lines) and reports how many had how many.
"""

import argparse
import collections
import os
import sys
import time


def count(d):
    try:
        return len(os.listdir(d))
    except FileNotFoundError:
        return 0


def wait_main(args):
    last, n, since = -1, 0, time.time()
    while True:
        n = count(args.dir)
        if n >= args.messages:
            return 0
        if n != last:
            last, since = n, time.time()
        elif time.time() - since > args.timeout:
            print(f"sink: only {n} of {args.messages} messages arrived", file=sys.stderr)
            return 1
        time.sleep(0.1)


def seen_main(args):
    prefix = f"X-Bench-Seq: {args.tag}-".encode()
    rcpts = collections.Counter()
    with open(args.out, "w") as out:
        for name in sorted(os.listdir(args.dir)):
            path = os.path.join(args.dir, name)
            mtime = os.stat(path).st_mtime_ns / 1e9
            with open(path, "rb") as f:
                head = f.read(16384)
            i = head.find(prefix)
            if i < 0:
                continue
            j = head.find(b"\n", i)
            seq = int(head[i + len(prefix):j].strip())
            rcpts[head.count(b"X-Rcpt-Args:")] += 1
            out.write(f"{seq}\t{mtime:.6f}\t{name}\n")
    shape = ", ".join(f"{n} with {k} recipient(s)" for k, n in sorted(rcpts.items()))
    print(f"sink: transactions: {shape or 'none'}", file=sys.stderr)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    wp = sub.add_parser("wait")
    wp.add_argument("dir")
    wp.add_argument("--messages", type=int, required=True)
    wp.add_argument("--timeout", type=float, default=60)
    sp = sub.add_parser("seen")
    sp.add_argument("dir")
    sp.add_argument("--tag", required=True)
    sp.add_argument("--out", required=True)
    args = p.parse_args()
    return {"wait": wait_main, "seen": seen_main}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
