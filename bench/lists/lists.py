#!/usr/bin/env python3
"""bench/lists/lists.py: the loader and the sink reader of bench/lists/run.sh.

  lists.py post HOST PORT --sender S --to T [--rcpt-prefix P --rcpt-domain D --rcpts N]
                          --size B --out FILE
  lists.py wait DIR --recipients N [--timeout S] --out FILE
  lists.py report --name NAME --sent FILE --seen FILE --cpu FILE --commits N --members N
                  --json FILE

post: one SMTP transaction (smtplib): MAIL FROM S, RCPT TO every recipient (T alone, or
P1@D .. PN@D), a message of about B bytes; writes {"t250": <time the 250 after DATA came>}.

wait: smtp-sink (-d DIR/...) writes one file per transaction with one `X-Rcpt-Args` line per
recipient, and the file's modification time is when it had the whole message. Waits until
the files hold N recipients, or until S seconds pass in which that number did not grow (exit 1
then); writes {"recipients", "transactions", "last": the latest modification time}.

report: time from the 250 to the last recipient at the sink, recipients per second over that
time, CPU per recipient, commits per member; one line and a JSON file.
"""

import argparse
import json
import os
import smtplib
import sys
import time


def post_main(args):
    if args.rcpts:
        rcpts = [f"{args.rcpt_prefix}{i}@{args.rcpt_domain}" for i in range(1, args.rcpts + 1)]
    else:
        rcpts = [args.to]
    line = "The list bench's post. " * 3 + "\r\n"
    body = line * max(1, args.size // len(line))
    msg = (f"From: {args.sender}\r\nTo: {args.to}\r\nSubject: bench post\r\n"
           f"Message-ID: <bench.{time.time_ns()}@example.test>\r\n\r\n{body}")
    with smtplib.SMTP(args.host, args.port, timeout=300) as s:
        s.ehlo("loader.example.test")
        refused = s.sendmail(args.sender, rcpts, msg.encode())
        t250 = time.time()
    if refused:
        print(f"post: {len(refused)} recipients refused, e.g. {next(iter(refused.items()))}",
              file=sys.stderr)
        return 1
    with open(args.out, "w") as f:
        json.dump({"t250": t250, "recipients": len(rcpts)}, f)
    return 0


def scan(d):
    rcpts, files, last = 0, 0, 0.0
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return 0, 0, 0.0
    for name in names:
        path = os.path.join(d, name)
        try:
            st = os.stat(path)
            with open(path, "rb") as f:
                head = f.read(1 << 20)
        except OSError:
            continue
        end = head.find(b"\n\n")
        envelope = head if end < 0 else head[:end]
        n = envelope.count(b"X-Rcpt-Args:")
        if n == 0:
            continue  # a transaction still arriving
        rcpts += n
        files += 1
        last = max(last, st.st_mtime_ns / 1e9)
    return rcpts, files, last


def wait_main(args):
    seen, since = -1, time.time()
    while True:
        rcpts, files, last = scan(args.dir)
        if rcpts >= args.recipients:
            break
        if rcpts != seen:
            seen, since = rcpts, time.time()
        elif time.time() - since > args.timeout:
            print(f"sink: only {rcpts} of {args.recipients} recipients arrived", file=sys.stderr)
            break
        time.sleep(0.2)
    time.sleep(0.5)  # the last transaction's final write
    rcpts, files, last = scan(args.dir)
    with open(args.out, "w") as f:
        json.dump({"recipients": rcpts, "transactions": files, "last": last}, f)
    return 0 if rcpts >= args.recipients else 1


POSTFIX = {"master", "smtpd", "cleanup", "qmgr", "smtp", "trivial-rewrite", "postlogd",
           "anvil", "proxymap", "scache", "tlsmgr", "pickup", "bounce"}


def report_main(args):
    sent = json.load(open(args.sent))
    seen = json.load(open(args.seen))
    cpu = json.load(open(args.cpu)).get("cpu", {}) if args.cpu and os.path.exists(args.cpu) else {}
    if args.name.startswith("pepsi"):
        own = {k: v for k, v in cpu.items() if k.startswith("pepsi") or k == "postgres"}
    else:
        own = {k: v for k, v in cpu.items() if k in POSTFIX}
    seconds = max(seen["last"] - sent["t250"], 1e-6)
    r = {
        "name": args.name,
        "members": args.members,
        "delivered": seen["recipients"],
        "transactions": seen["transactions"],
        "seconds_250_to_last": seconds,
        "recipients_per_s": seen["recipients"] / seconds,
        "cpu_ms_per_recipient": sum(own.values()) / max(args.members, 1) * 1000,
        "commits_per_member": (args.commits / args.members) if args.commits >= 0 else None,
    }
    with open(args.json, "w") as f:
        json.dump(r, f)
    commits = f"{r['commits_per_member']:.2f}" if r["commits_per_member"] is not None else "-"
    print(f"{args.name:8} | {r['delivered']:>6}/{args.members} | {r['transactions']:>6} | "
          f"{seconds:8.2f} | {r['recipients_per_s']:8.0f} | {r['cpu_ms_per_recipient']:7.3f} | {commits}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("post")
    pp.add_argument("host")
    pp.add_argument("port", type=int)
    pp.add_argument("--sender", required=True)
    pp.add_argument("--to", required=True)
    pp.add_argument("--rcpt-prefix", default="user")
    pp.add_argument("--rcpt-domain", default="relay.example")
    pp.add_argument("--rcpts", type=int, default=0)
    pp.add_argument("--size", type=int, default=4096)
    pp.add_argument("--out", required=True)
    wp = sub.add_parser("wait")
    wp.add_argument("dir")
    wp.add_argument("--recipients", type=int, required=True)
    wp.add_argument("--timeout", type=float, default=120)
    wp.add_argument("--out", required=True)
    rp = sub.add_parser("report")
    rp.add_argument("--name", required=True)
    rp.add_argument("--sent", required=True)
    rp.add_argument("--seen", required=True)
    rp.add_argument("--cpu")
    rp.add_argument("--commits", type=int, default=-1)
    rp.add_argument("--members", type=int, required=True)
    rp.add_argument("--json", required=True)
    args = p.parse_args()
    return {"post": post_main, "wait": wait_main, "report": report_main}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
