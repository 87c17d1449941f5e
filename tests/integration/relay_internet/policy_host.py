"""A loopback stand-in for the MTA-STS policy hosts of the test domains (RFC 8461 §3.3).

One HTTPS server answers for every mta-sts.<domain> of a test: the certificate carries all
their names, and what each serves comes from a JSON file the test rewrites between
deliveries: {"mta-sts.a.test": {"status": 200, "type": "text/plain", "body": "..."}}.
Every request is appended to a log file as its Host, so a test can count fetches.

Usage: policy_host.py ADDRESS PORT CERT KEY POLICIES LOG
"""

import http.server
import json
import ssl
import sys

address, port, cert, key, policies, log = sys.argv[1:7]


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        host = (self.headers.get("Host") or "").split(":")[0].lower()
        with open(log, "a") as f:
            f.write(f"{host} {self.path}\n")
        with open(policies) as f:
            served = json.load(f).get(host)
        if served is None or self.path != "/.well-known/mta-sts.txt":
            self.send_response(404)
            self.end_headers()
            return
        body = served["body"].encode()
        self.send_response(served.get("status", 200))
        self.send_header("Content-Type", served.get("type", "text/plain"))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer((address, int(port)), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print("ready", flush=True)
server.serve_forever()
