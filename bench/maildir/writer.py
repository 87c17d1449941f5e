#!/usr/bin/env python3
"""bench/maildir/writer.py: keyed deliveries through pepsi-helper-maildir-writer's protocol.

    writer.py fill MAILDIR FILES        make MAILDIR with FILES keyed names in cur/ (empty files,
                                        as a reader leaves them: `<key>.<host>,S=4096:2,S`)
    writer.py run WRITER MAILDIR N ROUND [WRITER ARGS...]
                                        start WRITER --root <parent of MAILDIR> --allow-root-owner
                                        ARGS, send N keyed 4 KiB deliveries (dir-sync later, one
                                        `sync` every ROUND, as the Maildir stage sends a round),
                                        print one JSON line: deliveries/s and the writer's CPU
                                        (user + system) per delivery
    writer.py summary SIZE ON OFF       the medians of the JSON lines in ON and OFF, and ratios

Each delivery is a new key (a row never delivered before), so every one asks the writer
whether its copy is stored already and gets "no": the question whose cost grows with the
mailbox when the writer reads new/ and cur/ to answer it.
"""
import json
import os
import resource
import statistics
import subprocess
import sys
import time

INCARNATION = 1_765_000_000_123_456


def keyed(row):
    secs, usecs = divmod(INCARNATION, 1_000_000)
    return f"{secs}.M{usecs}W{row}K{row * 0x9E3779B97F4A7C15 % (1 << 64):016x}."


def fill(maildir, files):
    for sub in ("tmp", "new", "cur"):
        os.makedirs(os.path.join(maildir, sub), exist_ok=True)
    cur = os.path.join(maildir, "cur")
    for row in range(1, files + 1):
        with open(os.path.join(cur, f"{keyed(row)}bench,S=4096:2,S"), "wb"):
            pass


def run(writer, maildir, n, rnd, extra):
    root = os.path.dirname(os.path.abspath(maildir))
    p = subprocess.Popen(
        [writer, "--root", root, "--allow-root-owner", "-L", "warn", *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    body = (b"Subject: bench\r\n\r\n" + b"x" * 76 + b"\r\n") * 52
    first = 10_000_000  # rows above every name fill() made
    start = time.monotonic()
    for i in range(n):
        head = (
            f"mailbox {os.path.abspath(maildir)}\nreturn-path bench@example.test\n"
            f"delivered-to alice@example.test\nkey {first + i} {INCARNATION}\nquota 0\n"
            f"quota-messages 0\ndir-sync later\nsize {len(body)}\n"
        ).encode()
        p.stdin.write(head + body)
        p.stdin.flush()
        line = p.stdout.readline()
        if not line.startswith(b"ok "):
            sys.exit(f"delivery {i}: {line!r}")
        if (i + 1) % rnd == 0 or i + 1 == n:
            p.stdin.write(b"sync\n")
            p.stdin.flush()
            line = p.stdout.readline()
            if not line.startswith(b"ok synced"):
                sys.exit(f"sync after {i + 1}: {line!r}")
    elapsed = time.monotonic() - start
    p.stdin.close()
    if p.wait() != 0:
        sys.exit(f"the writer exited {p.returncode}")
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru.ru_utime + ru.ru_stime
    print(json.dumps({"per_s": round(n / elapsed, 1), "cpu_ms": round(cpu * 1000 / n, 3)}))


def summary(size, on, off):
    def med(path, field):
        return statistics.median(json.loads(line)[field] for line in open(path))

    a, b = med(on, "per_s"), med(off, "per_s")
    c, d = med(on, "cpu_ms"), med(off, "cpu_ms")
    print(
        f"{size} files in cur/: index {a:.0f}/s, {c:.3f} ms CPU a delivery; "
        f"without {b:.0f}/s, {d:.3f} ms: {a / b:.2f}x the rate, {c / d:.2f}x the CPU"
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "fill":
        fill(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 5 and sys.argv[1] == "summary":
        summary(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) >= 6 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:])
    else:
        sys.exit(__doc__)
