"""A stand-in for a GNU Taler wallet, for the auto-pay tests (tests/integration/helper_auto_pay.rs).
It is a test program, not Taler: it pays an order of the loopback merchant stand-in
(merchant.py) by that stand-in's own test endpoint.

Usage: wallet.py [--hang] URI. The URI, the last argument, must be taler://pay/HOST:PORT/ORDER/
(anything after ORDER is ignored). It first appends "UID URI" (its own os.getuid()) to
$HOME/wallet.log, so a test sees whom it ran as, then POSTs to http://HOST:PORT/test/pay/ORDER.
It exits 0 when the merchant answers 200, and 1 with a message on stderr when the merchant
says no or cannot be reached, or when the URI is not one. --hang sleeps instead of paying
(a wallet that never answers).
"""

import os
import re
import sys
import time
import urllib.error
import urllib.request


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit("wallet.py: no URI")
    uri = args[-1]
    with open(os.path.join(os.environ["HOME"], "wallet.log"), "a") as log:
        log.write("%d %s\n" % (os.getuid(), uri))
    if "--hang" in args[:-1]:
        time.sleep(3600)
    m = re.fullmatch(r"taler://pay/([A-Za-z0-9.-]+:[0-9]+)/([A-Za-z0-9_.~-]+)(/.*)?", uri)
    if not m:
        sys.stderr.write("wallet.py: not a taler://pay/HOST:PORT/ORDER/ URI: %s\n" % uri)
        sys.exit(1)
    host, order = m.group(1), m.group(2)
    req = urllib.request.Request("http://%s/test/pay/%s" % (host, order), data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
    except urllib.error.HTTPError as e:
        sys.stderr.write("wallet.py: the merchant refused order %s: %d %s\n"
                         % (order, e.code, e.read().decode(errors="replace")))
        sys.exit(1)
    except OSError as e:
        sys.stderr.write("wallet.py: cannot reach the merchant at %s: %s\n" % (host, e))
        sys.exit(1)


if __name__ == "__main__":
    main()
