"""A Web Key Directory over HTTPS for the key-discovery tests (tests/integration/crypto.rs).

Usage: wkd_server.py PORT CERT KEY ROOT. Serves the files under ROOT (the
.well-known/openpgpkey tree) on 127.0.0.1:PORT with the given certificate, 404 for anything
else, and logs each request path on stderr.
"""

import http.server
import os
import ssl
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    root = "."

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        full = os.path.realpath(os.path.join(self.root, path.lstrip("/")))
        sys.stderr.write("GET %s host=%s\n" % (self.path, self.headers.get("Host")))
        sys.stderr.flush()
        if not full.startswith(os.path.realpath(self.root)) or not os.path.isfile(full):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with open(full, "rb") as f:
            body = f.read()
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    port, cert, key, root = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    Handler.root = root
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
