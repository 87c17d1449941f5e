#!/usr/bin/env python3
"""bench/e2e/e2e.py: the load generator, Maildir watcher, CPU sampler and report of
bench/e2e/run.sh (SMTP in -> Maildir, end to end).

  e2e.py load   HOST PORT --messages N --clients C --tag T --out FILE [--rate R]
                [--rcpt ADDR] [--rcpt-count K]
  e2e.py watch  MAILDIR --messages N --tag T --out FILE [--timeout S]
  e2e.py cpu    --out FILE --stop FILE
  e2e.py report --name NAME --sent FILE --seen FILE [--cpu FILE] [--json FILE]

load: C concurrent SMTP clients (asyncio), one message per connection like smtp-source's
default, N messages in all of about 4 KiB each, every one with a unique `X-Bench-Seq: T-<n>`
header. With --rate R, message n is started n/R seconds after the first (an open loop below
saturation, for latency without a backlog). For each it records the wall-clock time its connection opened, the time the final
dot was written and the time the server's 250 for it was read.

watch: records the wall-clock time each file first appears in MAILDIR/new (inotify
IN_CREATE | IN_MOVED_TO, so both link(2) and rename(2) deliveries are seen at once; a
directory scan covers an inotify queue overflow). Files present when it starts are ignored.
It exits once N files have appeared or after --timeout seconds without a new one, then reads
each file's X-Bench-Seq header (reading is deferred so it costs nothing during the run).

cpu: samples /proc every 0.5 s until the stop file exists and writes CPU seconds per command
name (utime + stime deltas of every process seen): which process was on the CPU.

report: joins the two records on the seq: latency = appear - 250; msg/s = N / (last appear -
first connection). The 250 is timestamped when the loader reads it, so on a busy machine a
file can appear before its 250 is read (negative latency): the report counts those and also
gives end of data -> Maildir, which cannot be negative. Prints a summary and, with --json, writes the figures.
"""

import argparse
import asyncio
import ctypes
import ctypes.util
import json
import os
import select
import struct
import sys
import time


# ---------------------------------------------------------------------------------- load

def message(tag, seq, size, sender, rcpt):
    head = (
        f"From: <{sender}>\r\n"
        f"To: <{rcpt}>\r\n"
        f"Subject: e2e bench {tag} {seq}\r\n"
        f"Message-ID: <{tag}.{seq}@bench.example.org>\r\n"
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S +0000', time.gmtime())}\r\n"
        f"X-Bench-Seq: {tag}-{seq}\r\n"
        "\r\n"
    ).encode()
    line = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopq\r\n"
    body = bytearray()
    while len(head) + len(body) + len(line) <= size:
        body += line
    pad = size - len(head) - len(body)
    if pad >= 3:
        body += b"x" * (pad - 2) + b"\r\n"
    return head + bytes(body)


async def reply(reader):
    """Reads one (possibly multi-line) SMTP reply; returns its code."""
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("connection closed by the server")
        if len(line) < 4 or line[3:4] != b"-":
            return int(line[:3])


async def expect(reader, codes, what):
    code = await reply(reader)
    if code not in codes:
        raise RuntimeError(f"{what}: {code}")


def recipients(args):
    """--rcpt itself, or with --rcpt-count K > 1: K addresses local1@domain … localK@domain."""
    if args.rcpt_count <= 1:
        return [args.rcpt]
    local, domain = args.rcpt.rsplit("@", 1)
    return [f"{local}{i}@{domain}" for i in range(1, args.rcpt_count + 1)]


async def client(args, queue, results, errors):
    while True:
        try:
            seq = queue.get_nowait()
        except asyncio.QueueEmpty:
            return
        if args.rate:
            # Open loop: message n starts n / rate seconds after the first.
            delay = args.start + seq / args.rate - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
        t0 = time.time()
        writer = None
        try:
            reader, writer = await asyncio.open_connection(args.host, args.port)
            await expect(reader, (220,), "greeting")
            writer.write(b"EHLO loader.example.org\r\n")
            await expect(reader, (250,), "EHLO")
            writer.write(f"MAIL FROM:<{args.sender}>\r\n".encode())
            await expect(reader, (250,), "MAIL")
            for rcpt in recipients(args):
                writer.write(f"RCPT TO:<{rcpt}>\r\n".encode())
                await expect(reader, (250, 251), "RCPT")
            writer.write(b"DATA\r\n")
            await expect(reader, (354,), "DATA")
            writer.write(message(args.tag, seq, args.size, args.sender, args.rcpt) + b".\r\n")
            tdot = time.time()
            await expect(reader, (250,), "end of data")
            t250 = time.time()
            results.append((seq, t0, tdot, t250))
            writer.write(b"QUIT\r\n")
            await writer.drain()
            try:
                await asyncio.wait_for(reply(reader), 5)
            except (asyncio.TimeoutError, ConnectionError):
                pass
        except Exception as e:  # one failed message must not stop the run; it is counted
            errors.append((seq, f"{type(e).__name__}: {e}"))
        finally:
            if writer is not None:
                writer.close()
                try:
                    await writer.wait_closed()
                except Exception:
                    pass


async def load_main(args):
    queue = asyncio.Queue()
    for seq in range(args.messages):
        queue.put_nowait(seq)
    results, errors = [], []
    args.start = time.time()
    await asyncio.gather(*(client(args, queue, results, errors) for _ in range(args.clients)))
    with open(args.out, "w") as f:
        for seq, t0, tdot, t250 in sorted(results):
            f.write(f"{seq}\t{t0:.6f}\t{tdot:.6f}\t{t250:.6f}\n")
        for seq, err in errors:
            f.write(f"{seq}\terror\t{err}\n")
    if errors:
        print(f"load: {len(errors)} of {args.messages} messages failed, first: {errors[0][1]}",
              file=sys.stderr)
    return 0 if results else 1


# --------------------------------------------------------------------------------- watch

IN_CREATE = 0x00000100
IN_MOVED_TO = 0x00000080
IN_Q_OVERFLOW = 0x00004000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
EVENT = struct.Struct("iIII")


def watch_main(args):
    new = os.path.join(args.maildir, "new")
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    if libc.inotify_add_watch(fd, new.encode(), IN_CREATE | IN_MOVED_TO) < 0:
        raise OSError(ctypes.get_errno(), f"inotify_add_watch {new}")
    before = set(os.listdir(new))
    seen = {}
    overflows = 0
    if args.ready:
        with open(args.ready, "w") as f:
            f.write("ready\n")
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    last = time.time()
    while len(seen) < args.messages:
        if not poll.poll(200):
            if time.time() - last > args.timeout:
                break
            continue
        now = time.time()
        last = now
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            continue
        off = 0
        while off < len(data):
            _wd, mask, _cookie, length = EVENT.unpack_from(data, off)
            name = data[off + EVENT.size: off + EVENT.size + length].rstrip(b"\0").decode()
            off += EVENT.size + length
            if mask & IN_Q_OVERFLOW:
                overflows += 1
                for n in os.listdir(new):
                    if n not in before and n not in seen:
                        seen[n] = now
            elif name and name not in before and name not in seen:
                seen[name] = now
    os.close(fd)
    prefix = f"X-Bench-Seq: {args.tag}-".encode()
    missing = 0
    with open(args.out, "w") as f:
        for name, t in seen.items():
            try:
                with open(os.path.join(new, name), "rb") as m:
                    head = m.read(8192)
            except FileNotFoundError:
                missing += 1
                continue
            i = head.find(prefix)
            if i < 0:
                continue
            j = head.find(b"\r\n", i)
            if j < 0:
                j = head.find(b"\n", i)
            f.write(f"{int(head[i + len(prefix):j])}\t{t:.6f}\t{name}\n")
    if overflows or missing:
        print(f"watch: {overflows} inotify overflows, {missing} files gone before reading",
              file=sys.stderr)
    return 0


# ----------------------------------------------------------------------------------- cpu

def cpu_main(args):
    tick = os.sysconf("SC_CLK_TCK")
    last = {}   # pid -> (comm, ticks)
    used = {}   # comm -> ticks
    t0 = time.time()
    while True:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1: stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            ticks = int(fields[11]) + int(fields[12])
            prev = last.get(pid)
            if prev is not None and prev[0] == comm:
                used[comm] = used.get(comm, 0) + ticks - prev[1]
            last[pid] = (comm, ticks)
        if os.path.exists(args.stop):
            break
        time.sleep(0.5)
    secs = time.time() - t0
    with open(args.out, "w") as f:
        json.dump({"seconds": secs, "cpu": {k: v / tick for k, v in used.items() if v}}, f)
    return 0


# -------------------------------------------------------------------------------- report

def percentile(sorted_values, p):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, int(round(p / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def report_main(args):
    sent, failed = {}, 0
    with open(args.sent) as f:
        for line in f:
            seq, a, rest = line.rstrip("\n").split("\t", 2)
            if a == "error":
                failed += 1
            else:
                tdot, t250 = rest.split("\t")
                sent[int(seq)] = (float(a), float(tdot), float(t250))
    seen = {}
    with open(args.seen) as f:
        for line in f:
            seq, t, _name = line.rstrip("\n").split("\t", 2)
            seen.setdefault(int(seq), float(t))
    both = sorted(set(sent) & set(seen))
    lat = sorted(seen[s] - sent[s][2] for s in both)
    from_dot = sorted(seen[s] - sent[s][1] for s in both)
    accept = sorted(t250 - tdot for _, tdot, t250 in sent.values())
    first = min(t0 for t0, _, _ in sent.values())
    last_seen = max(seen[s] for s in both) if both else first
    last_250 = max(t for _, _, t in sent.values())
    n = len(both)
    out = {
        "name": args.name,
        "sent": len(sent) + failed,
        "accepted": len(sent),
        "failed": failed,
        "delivered": n,
        "seconds": last_seen - first,
        "msg_per_s": n / (last_seen - first) if n else 0.0,
        "accepted_per_s": len(sent) / (last_250 - first) if sent else 0.0,
        "p50_ms": percentile(lat, 50) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
        "max_ms": (lat[-1] if lat else float("nan")) * 1000,
        "before_250": sum(1 for x in lat if x < 0),
        "dot_to_maildir_p50_ms": percentile(from_dot, 50) * 1000,
        "dot_to_maildir_p99_ms": percentile(from_dot, 99) * 1000,
        "dot_to_250_p50_ms": percentile(accept, 50) * 1000,
        "dot_to_250_p99_ms": percentile(accept, 99) * 1000,
    }
    if args.cpu and os.path.exists(args.cpu):
        with open(args.cpu) as f:
            out["cpu"] = json.load(f)
    print(f"{args.name:8}: {out['msg_per_s']:7.0f} msg/s end to end ({n} of {out['sent']} "
          f"delivered in {out['seconds']:.2f} s; accepted {out['accepted_per_s']:.0f} msg/s), "
          f"latency 250 -> Maildir p50 {out['p50_ms']:.0f} ms, p99 {out['p99_ms']:.0f} ms, "
          f"max {out['max_ms']:.0f} ms")
    print(f"          end of data -> 250 p50 {out['dot_to_250_p50_ms']:.0f} ms, "
          f"p99 {out['dot_to_250_p99_ms']:.0f} ms; end of data -> Maildir p50 "
          f"{out['dot_to_maildir_p50_ms']:.0f} ms, p99 {out['dot_to_maildir_p99_ms']:.0f} ms; "
          f"{out['before_250']} files appeared before the loader read their 250")
    if "cpu" in out:
        top = sorted(out["cpu"]["cpu"].items(), key=lambda kv: -kv[1])[:8]
        secs = out["cpu"]["seconds"]
        print("          CPU (share of one core over the run): " +
              ", ".join(f"{k} {v / secs:.0%}" for k, v in top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)
    return 0 if n == out["sent"] else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("load")
    lp.add_argument("host")
    lp.add_argument("port", type=int)
    lp.add_argument("--messages", type=int, default=4000)
    lp.add_argument("--clients", type=int, default=20)
    lp.add_argument("--size", type=int, default=4096)
    lp.add_argument("--tag", required=True)
    lp.add_argument("--sender", default="bob@example.org")
    lp.add_argument("--rcpt", default="alice@example.test")
    lp.add_argument("--rcpt-count", type=int, default=1,
                    help="recipients per message (numbered local parts when more than one)")
    lp.add_argument("--rate", type=float, default=0,
                    help="start messages at this many per second (0: as fast as the clients go)")
    lp.add_argument("--out", required=True)
    wp = sub.add_parser("watch")
    wp.add_argument("maildir")
    wp.add_argument("--messages", type=int, required=True)
    wp.add_argument("--tag", required=True)
    wp.add_argument("--out", required=True)
    wp.add_argument("--ready", help="file written once the watch is in place")
    wp.add_argument("--timeout", type=float, default=60,
                    help="give up after this many seconds without a new file")
    cp = sub.add_parser("cpu")
    cp.add_argument("--out", required=True)
    cp.add_argument("--stop", required=True)
    rp = sub.add_parser("report")
    rp.add_argument("--name", required=True)
    rp.add_argument("--sent", required=True)
    rp.add_argument("--seen", required=True)
    rp.add_argument("--cpu")
    rp.add_argument("--json")
    args = p.parse_args()
    if args.cmd == "load":
        return asyncio.run(load_main(args))
    return {"watch": watch_main, "cpu": cpu_main, "report": report_main}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
