#!/usr/bin/python3
"""A test filter on Sendmail's own libmilter (Debian's python3-milter), for
tests/integration/milter.rs: it takes every action the milter protocol has, chosen by
the message's Subject and its recipients' local parts, and writes one JSON line per
message to LOG with what it was told (macros, client, sender, recipients, headers, body).

    actions.py PORT LOG

Recipients: refuse@ is refused (550 5.1.1), defer@ deferred (451 4.7.1).
Subjects: edit (every header, body and envelope change, with progress), quarantine,
discard, reject (554 5.7.1), tempfail, accept-at-mail (the sender is accept@), slow
(sleeps 5 s at the end of the message), flood (adds 20 header fields of 8000 bytes).
Anything else passes unchanged.
"""
import json
import sys
import time

import Milter

LOG = None


class Actions(Milter.Base):
    def __init__(self):
        self.id = Milter.uniqueID()
        self.reset()

    def reset(self):
        self.seen = {"rcpt": [], "headers": [], "body": b""}

    def note(self, key, value):
        self.seen[key] = value

    @Milter.noreply
    def connect(self, hostname, family, hostaddr):
        self.client = {"host": hostname, "addr": hostaddr[0] if hostaddr else None,
                       "client_addr": self.getsymval("{client_addr}"),
                       "j": self.getsymval("j")}
        return Milter.CONTINUE

    @Milter.noreply
    def hello(self, name):
        self.helo = name
        return Milter.CONTINUE

    def envfrom(self, mailfrom, *args):
        self.reset()
        self.seen["from"] = mailfrom
        self.seen["queue_id"] = self.getsymval("i")
        self.seen["auth"] = self.getsymval("{auth_authen}")
        if mailfrom.strip("<>").startswith("accept@"):
            self.write()
            return Milter.ACCEPT
        return Milter.CONTINUE

    def envrcpt(self, to, *args):
        local = to.strip("<>").split("@")[0]
        if local == "refuse":
            self.setreply("550", "5.1.1", "no such user here")
            return Milter.REJECT
        if local == "defer":
            self.setreply("451", "4.7.1", "try this one later")
            return Milter.TEMPFAIL
        self.seen["rcpt"].append(to)
        return Milter.CONTINUE

    @Milter.noreply
    def header(self, name, value):
        self.seen["headers"].append([name, value])
        return Milter.CONTINUE

    def body(self, chunk):
        self.seen["body"] += chunk
        return Milter.CONTINUE

    def subject(self):
        for name, value in self.seen["headers"]:
            if name.lower() == "subject":
                return value.strip()
        return ""

    def write(self):
        seen = dict(self.seen)
        seen["body"] = seen["body"].decode("utf-8", "replace")
        seen["client"] = getattr(self, "client", None)
        seen["helo"] = getattr(self, "helo", None)
        with open(LOG, "a") as f:
            f.write(json.dumps(seen) + "\n")

    def eom(self):
        self.write()
        subject = self.subject()
        if subject == "edit":
            self.progress()
            self.addheader("X-Filter", "added")
            self.addheader("X-Top", "first", 0)
            self.chgheader("Subject", 1, "edited by the filter")
            self.chgheader("X-Remove", 1, "")
            self.replacebody(b"replaced by the filter\r\n")
            self.chgfrom("<changed@example.test>")
            self.addrcpt("<bob@example.test>")
            self.delrcpt("<carol@example.test>")
            self.progress()
            return Milter.ACCEPT
        if subject == "flood":
            # A misbehaving filter: 20 header fields of 8000 bytes each, every one within
            # the bounds of a packet and of the count of changes.
            for i in range(20):
                self.addheader(f"X-Flood-{i}", "x" * 8000)
            return Milter.ACCEPT
        if subject == "quarantine":
            self.quarantine("held for review")
            return Milter.CONTINUE
        if subject == "discard":
            return Milter.DISCARD
        if subject == "reject":
            self.setreply("554", "5.7.1", "rejected as spam")
            return Milter.REJECT
        if subject == "tempfail":
            return Milter.TEMPFAIL
        if subject == "slow":
            time.sleep(5)
        return Milter.CONTINUE


def main():
    global LOG
    port, LOG = sys.argv[1], sys.argv[2]
    Milter.factory = Actions
    Milter.set_flags(Milter.ADDHDRS | Milter.CHGHDRS | Milter.CHGBODY | Milter.ADDRCPT
                     | Milter.DELRCPT | Milter.CHGFROM | Milter.QUARANTINE)
    sys.stdout.write("listening\n")
    sys.stdout.flush()
    Milter.runmilter("pepsi-test", f"inet:{port}@127.0.0.1", 60)


if __name__ == "__main__":
    main()
