"""A loopback stand-in for an OAuth 2.0 authorisation server's token endpoint (Microsoft
365's or Google's), for tests/integration/relay_smarthost_oauth.rs. It is a test peer: it
implements the refresh grant of RFC 6749 section 6 for one client and one refresh token.

Usage: token_endpoint.py PORT CERT KEY CLIENT_ID CLIENT_SECRET REFRESH_TOKEN ACCESS_TOKEN LOG
  HTTPS on 127.0.0.1:PORT with CERT/KEY (PEM). POST /token with an
  application/x-www-form-urlencoded body:
  - grant_type=refresh_token, client_id=CLIENT_ID, client_secret=CLIENT_SECRET and
    refresh_token=REFRESH_TOKEN: 200 {"access_token": ACCESS_TOKEN, "token_type": "Bearer",
    "expires_in": 3600, "refresh_token": REFRESH_TOKEN + "-rotated"}; from then on the
    rotated refresh token is the valid one (the provider rotates refresh tokens);
  - a wrong client: 401 {"error": "invalid_client"};
  - any other refresh token: 400 {"error": "invalid_grant", "error_description":
    "AADSTS70008: The provided authorization code or refresh token has expired due to
    inactivity."} (RFC 6749 section 5.2).
Each request is appended to LOG as one JSON object per line: the path, the content type and
the form's fields.
"""

import http.server
import json
import ssl
import sys
import threading
import urllib.parse

PORT, CERT, KEY, CLIENT_ID, CLIENT_SECRET, REFRESH_TOKEN, ACCESS_TOKEN, LOG = sys.argv[1:9]
STATE = {"refresh_token": REFRESH_TOKEN}
LOCK = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        text = self.rfile.read(n).decode() if n else ""
        form = {k: v[0] for k, v in urllib.parse.parse_qs(text, keep_blank_values=True).items()}
        with LOCK:
            with open(LOG, "a") as f:
                f.write(json.dumps({
                    "path": self.path,
                    "content_type": self.headers.get("Content-Type"),
                    "form": form,
                }) + "\n")
            if self.path != "/token":
                return self.reply(404, {"error": "not_found"})
            if form.get("grant_type") != "refresh_token":
                return self.reply(400, {"error": "unsupported_grant_type"})
            if form.get("client_id") != CLIENT_ID or form.get("client_secret") != CLIENT_SECRET:
                return self.reply(401, {"error": "invalid_client"})
            if form.get("refresh_token") != STATE["refresh_token"]:
                return self.reply(400, {
                    "error": "invalid_grant",
                    "error_description": "AADSTS70008: The provided authorization code or "
                    "refresh token has expired due to inactivity.",
                })
            STATE["refresh_token"] = STATE["refresh_token"] + "-rotated"
            self.reply(200, {
                "token_type": "Bearer",
                "scope": form.get("scope", ""),
                "expires_in": 3600,
                "access_token": ACCESS_TOKEN,
                "refresh_token": STATE["refresh_token"],
            })

    def log_message(self, *args):
        pass


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(PORT)), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(CERT, KEY)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
