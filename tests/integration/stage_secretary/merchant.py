"""A loopback stand-in for a GNU Taler merchant backend, for the secretary's postage tests
(tests/integration/stage_secretary.rs). It is a test peer, not Taler: it implements the two
endpoints the secretary speaks and one of its own that plays the wallet's payment.

Usage: merchant.py PORT TOKEN. On 127.0.0.1:PORT:
  POST /private/orders          {"order": {"amount", "summary"}} -> {"order_id"}
  GET  /private/orders/ID       {"order_status": "unpaid", "taler_pay_uri"} or "paid"
  POST /test/pay/ID             marks the order paid (what a wallet's payment does)
Every /private/ request must carry "Authorization: Bearer TOKEN" (else 401). Each request is
logged on stderr as METHOD PATH BODY.
"""

import http.server
import json
import sys
import threading

ORDERS = {}
LOCK = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    token = ""

    def reply(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def authorised(self):
        if self.headers.get("Authorization") != "Bearer " + self.token:
            self.reply(401, {"code": 1, "hint": "unauthorised"})
            return False
        return True

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n).decode() if n else ""

    def do_POST(self):
        text = self.body()
        sys.stderr.write("POST %s %s\n" % (self.path, text))
        sys.stderr.flush()
        if self.path == "/private/orders":
            if not self.authorised():
                return
            order = json.loads(text)["order"]
            with LOCK:
                oid = "o-%d" % (len(ORDERS) + 1)
                ORDERS[oid] = {"amount": order["amount"], "paid": False}
            self.reply(200, {"order_id": oid})
        elif self.path.startswith("/test/pay/"):
            oid = self.path[len("/test/pay/"):]
            with LOCK:
                if oid not in ORDERS:
                    return self.reply(404, {"hint": "no order"})
                ORDERS[oid]["paid"] = True
            self.reply(200, {"paid": oid})
        else:
            self.reply(404, {"hint": "no such endpoint"})

    def do_GET(self):
        sys.stderr.write("GET %s\n" % self.path)
        sys.stderr.flush()
        if not self.path.startswith("/private/orders/"):
            return self.reply(404, {"hint": "no such endpoint"})
        if not self.authorised():
            return
        oid = self.path[len("/private/orders/"):]
        with LOCK:
            order = ORDERS.get(oid)
        if order is None:
            return self.reply(404, {"hint": "no order"})
        if order["paid"]:
            return self.reply(200, {"order_status": "paid"})
        host = "127.0.0.1:%d" % self.server.server_address[1]
        self.reply(200, {"order_status": "unpaid",
                         "taler_pay_uri": "taler://pay/%s/%s/" % (host, oid)})

    def log_message(self, *args):
        pass


def main():
    port, token = int(sys.argv[1]), sys.argv[2]
    Handler.token = token
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
