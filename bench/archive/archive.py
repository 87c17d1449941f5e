#!/usr/bin/env python3
"""bench/archive/archive.py: the corpus and the query runner of bench/archive/run.sh.

  archive.py corpus --messages N --mbox FILE --maildir DIR --queries FILE [--seed S]
  archive.py search --queries FILE --out FILE -- COMMAND... {}
  archive.py report --name NAME --import-seconds S --messages N --searches FILE --json FILE

corpus: N list posts in threads (a post and 0 to 7 replies with In-Reply-To and
References), authors from a pool of 2,000 addresses, subjects and bodies of words drawn from
a vocabulary of 20,000 made-up words with a Zipf-like skew (a few common, most rare), about
1.5 KB each. The same posts are written as one mbox (for pepsi-archive import) and as a
Maildir (for notmuch new). The queries file gets 200 queries, one per line: 120 single
words (common and rare), 40 two-word queries, 40 `from:` queries; the notmuch form of each
is the same but for `from:` (the same prefix in both).

search: runs COMMAND with {} replaced by each query, one at a time, and records each run's
wall time and whether it found anything (output printed; for JSON output, a non-empty
"hits"); writes {"times": [...], "empty": n}.

report: the import rate and the search p50/p99 as one line and a JSON file.
"""

import argparse
import json
import mailbox
import os
import random
import subprocess
import sys
import time


def words(rng, n):
    syll = ["ka", "lo", "mi", "ne", "su", "ra", "to", "vi", "ze", "po", "qu", "ri", "da", "fe"]
    out = set()
    while len(out) < n:
        out.add("".join(rng.choice(syll) for _ in range(rng.randint(2, 4))))
    return sorted(out)


def corpus_main(a):
    rng = random.Random(a.seed)
    vocab = words(rng, 20000)
    # Zipf-like: index drawn as int(len * u^3) favours the first words.
    pick = lambda: vocab[int(len(vocab) * rng.random() ** 3)]
    authors = [f"user{i}@example{i % 17}.test" for i in range(2000)]
    mbox_out = open(a.mbox, "wb")
    md = mailbox.Maildir(a.maildir, create=True)
    n = 0
    t0 = 1_700_000_000
    threads = 0
    while n < a.messages:
        threads += 1
        root_id = f"<t{threads}.0@bench.example.test>"
        subject = " ".join(pick() for _ in range(rng.randint(3, 7)))
        chain = []
        for k in range(rng.randint(1, 8)):
            if n >= a.messages:
                break
            n += 1
            mid = root_id if k == 0 else f"<t{threads}.{k}@bench.example.test>"
            author = rng.choice(authors)
            date = time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime(t0 + n * 60))
            head = [f"From: User <{author}>", "To: big@example.test",
                    f"Subject: {'Re: ' if k else ''}{subject}", f"Date: {date}",
                    f"Message-ID: {mid}"]
            if chain:
                parent = rng.choice(chain)
                head.append(f"In-Reply-To: {parent}")
                head.append(f"References: {' '.join(chain[: chain.index(parent) + 1])}")
            lines = []
            for _ in range(rng.randint(15, 25)):
                lines.append(" ".join(pick() for _ in range(rng.randint(6, 12))))
            raw = ("\r\n".join(head) + "\r\n\r\n" + "\r\n".join(lines) + "\r\n").encode()
            chain.append(mid)
            stamp = time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(t0 + n * 60))
            mbox_out.write(f"From {author} {stamp}\n".encode())
            for line in raw.split(b"\r\n")[:-1]:
                if line.lstrip(b">").startswith(b"From "):
                    line = b">" + line
                mbox_out.write(line + b"\n")
            mbox_out.write(b"\n")
            md.add(raw.replace(b"\r\n", b"\n"))
            if n % 10000 == 0:
                print(f"corpus: {n} of {a.messages} messages", file=sys.stderr)
    mbox_out.close()
    with open(a.queries, "w") as f:
        for i in range(120):
            f.write((vocab[i * 7] if i % 2 else vocab[len(vocab) // 2 + i * 13]) + "\n")
        for i in range(40):
            f.write(f"{vocab[i * 3]} {vocab[i * 5 + 1]}\n")
        for i in range(40):
            f.write(f"from:user{i * 37}@example{(i * 37) % 17}.test\n")
    return 0


def search_main(a):
    queries = [q.strip() for q in open(a.queries) if q.strip()]
    times, empty = [], 0
    for q in queries:
        cmd = [c.replace("{}", q) for c in a.command]
        t = time.perf_counter()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - t)
        if p.returncode not in (0,):
            print(f"search: {cmd!r} exited {p.returncode}: {p.stderr.decode()[-300:]}",
                  file=sys.stderr)
            return 1
        text = p.stdout.strip()
        if text.startswith(b"{"):
            # pepsi-archive search --json: {"hits": [...]}
            text = b"x" if json.loads(text).get("hits") else b""
        if not text:
            empty += 1
    with open(a.out, "w") as f:
        json.dump({"times": times, "empty": empty}, f)
    return 0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def report_main(a):
    s = json.load(open(a.searches))
    rate = a.messages / a.import_seconds if a.import_seconds > 0 else 0
    p50, p99 = pct(s["times"], 50) * 1000, pct(s["times"], 99) * 1000
    row = {"name": a.name, "messages": a.messages, "import_seconds": a.import_seconds,
           "import_per_s": rate, "search_p50_ms": p50, "search_p99_ms": p99,
           "queries": len(s["times"]), "empty_results": s["empty"]}
    print(f"{a.name:<8} | {a.messages:>8} | {a.import_seconds:>8.1f} | {rate:>8.0f} | "
          f"{p50:>8.1f} | {p99:>8.1f} | {s['empty']:>5}")
    with open(a.json, "w") as f:
        json.dump(row, f)
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("--messages", type=int, required=True)
    c.add_argument("--mbox", required=True)
    c.add_argument("--maildir", required=True)
    c.add_argument("--queries", required=True)
    c.add_argument("--seed", type=int, default=42)
    s = sub.add_parser("search")
    s.add_argument("--queries", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("command", nargs=argparse.REMAINDER)
    r = sub.add_parser("report")
    r.add_argument("--name", required=True)
    r.add_argument("--import-seconds", type=float, required=True)
    r.add_argument("--messages", type=int, required=True)
    r.add_argument("--searches", required=True)
    r.add_argument("--json", required=True)
    a = ap.parse_args()
    if a.cmd == "search" and a.command[:1] == ["--"]:
        a.command = a.command[1:]
    return {"corpus": corpus_main, "search": search_main, "report": report_main}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
