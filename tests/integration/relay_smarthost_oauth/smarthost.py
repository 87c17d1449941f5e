"""A loopback stand-in for a smarthost that requires OAuth 2.0 (Microsoft 365, Gmail), for
tests/integration/relay_smarthost_oauth.rs. It is a test peer, not a mail server: one SMTP
listener that offers STARTTLS, then SMTP AUTH with bearer tokens only, and keeps what it
is sent instead of relaying it.

Usage: smarthost.py PORT CERT KEY USER TOKEN MECHANISMS LOG
  On 127.0.0.1:PORT, greeting as oauth.smarthost.test. STARTTLS with CERT/KEY (PEM). After
  it, EHLO offers AUTH MECHANISMS (e.g. "XOAUTH2 OAUTHBEARER"); AUTH is refused before TLS.
  AUTH OAUTHBEARER (RFC 7628) and XOAUTH2, with or without an initial response (without: an
  empty 334, then the response), accept exactly USER with the bearer token TOKEN: 235. Any
  other token gets the error challenge, a 334 with base64 JSON
  {"status":"invalid_token",...}; the client's answer is read (RFC 7628: a single ^A,
  "AQ=="; XOAUTH2: an empty line) and a 535 5.7.8 follows. MAIL is refused (530 5.7.0)
  until AUTH succeeded. A message after DATA is answered 250 and kept.
Each event is appended to LOG as one JSON object per line:
  {"event": "auth", "mechanism", "ok", "user", "host", "port", "token_matches", "answer"}
  {"event": "message", "mail_from", "rcpt", "data"}
"""

import base64
import json
import socket
import ssl
import sys
import threading

PORT, CERT, KEY, USER, TOKEN, MECHANISMS, LOG = sys.argv[1:8]
NAME = "oauth.smarthost.test"
LOCK = threading.Lock()
ERROR = {
    "status": "invalid_token",
    "scope": "https://outlook.office.com/SMTP.Send",
    "schemes": "bearer",
}


def log(event):
    with LOCK, open(LOG, "a") as f:
        f.write(json.dumps(event) + "\n")


class Session:
    def __init__(self, sock):
        self.sock = sock
        self.file = sock.makefile("rb")
        self.tls = False
        self.authenticated = False

    def send(self, line):
        self.sock.sendall(line.encode() + b"\r\n")

    def line(self):
        raw = self.file.readline(100000)
        if not raw:
            raise EOFError
        return raw.rstrip(b"\r\n").decode("utf-8", "replace")

    def ehlo(self):
        lines = [NAME, "8BITMIME", "ENHANCEDSTATUSCODES", "SIZE 10485760"]
        lines.append("AUTH " + MECHANISMS if self.tls else "STARTTLS")
        for i, text in enumerate(lines):
            self.send(("250 " if i == len(lines) - 1 else "250-") + text)

    def parse(self, mechanism, raw):
        """(user, token, host, port) of an initial response, None where absent."""
        parts = raw.split(b"\x01")
        pairs = {}
        user = None
        if mechanism == "OAUTHBEARER":
            gs2 = parts[0].decode()
            for field in gs2.split(","):
                if field.startswith("a="):
                    user = field[2:].replace("=2C", ",").replace("=3D", "=")
            rest = parts[1:]
        else:
            rest = parts
        for p in rest:
            if b"=" in p:
                k, v = p.split(b"=", 1)
                pairs[k.decode()] = v.decode()
        if mechanism == "XOAUTH2":
            user = pairs.get("user")
        auth = pairs.get("auth", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        return user, token, pairs.get("host"), pairs.get("port")

    def auth(self, words):
        mechanism = words[1].upper() if len(words) > 1 else ""
        if not self.tls:
            return self.send("538 5.7.11 Encryption required for requested authentication mechanism")
        if mechanism not in MECHANISMS.split():
            return self.send("504 5.5.4 Unrecognized authentication type")
        if len(words) > 2:
            encoded = words[2]
        else:
            self.send("334 ")
            encoded = self.line()
        try:
            raw = base64.b64decode(encoded, validate=True)
        except Exception:
            return self.send("501 5.5.2 Cannot decode response")
        user, token, host, port = self.parse(mechanism, raw)
        ok = user == USER and token == TOKEN
        event = {
            "event": "auth",
            "mechanism": mechanism,
            "ok": ok,
            "user": user,
            "host": host,
            "port": port,
            "token_matches": token == TOKEN,
            "initial_response": len(words) > 2,
        }
        if ok:
            self.authenticated = True
            log(event)
            return self.send("235 2.7.0 Authentication successful")
        challenge = base64.b64encode(json.dumps(ERROR).encode()).decode()
        self.send("334 " + challenge)
        event["answer"] = self.line()
        log(event)
        self.send("535 5.7.8 Authentication credentials invalid")

    def data(self, mail_from, rcpt):
        self.send("354 End data with <CR><LF>.<CR><LF>")
        lines = []
        while True:
            raw = self.file.readline(100000)
            if not raw:
                raise EOFError
            if raw == b".\r\n":
                break
            if raw.startswith(b"."):
                raw = raw[1:]
            lines.append(raw)
        data = b"".join(lines).decode("utf-8", "replace")
        log({"event": "message", "mail_from": mail_from, "rcpt": rcpt, "data": data})
        self.send("250 2.0.0 Ok: queued as 1")

    def run(self):
        self.send("220 " + NAME + " ESMTP test stand-in")
        mail_from, rcpt = None, []
        while True:
            line = self.line()
            words = line.split(" ")
            verb = words[0].upper()
            if verb in ("EHLO", "HELO"):
                self.ehlo()
            elif verb == "STARTTLS" and not self.tls:
                self.send("220 2.0.0 Ready to start TLS")
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.load_cert_chain(CERT, KEY)
                self.sock = context.wrap_socket(self.sock, server_side=True)
                self.file = self.sock.makefile("rb")
                self.tls = True
            elif verb == "AUTH":
                self.auth(words)
            elif verb == "MAIL":
                if not self.authenticated:
                    self.send("530 5.7.0 Authentication required")
                else:
                    mail_from, rcpt = line.split("<", 1)[1].split(">", 1)[0], []
                    self.send("250 2.1.0 Ok")
            elif verb == "RCPT" and mail_from is not None:
                rcpt.append(line.split("<", 1)[1].split(">", 1)[0])
                self.send("250 2.1.5 Ok")
            elif verb == "DATA" and rcpt:
                self.data(mail_from, rcpt)
                mail_from, rcpt = None, []
            elif verb == "RSET":
                mail_from, rcpt = None, []
                self.send("250 2.0.0 Ok")
            elif verb == "NOOP":
                self.send("250 2.0.0 Ok")
            elif verb == "QUIT":
                self.send("221 2.0.0 Bye")
                return
            else:
                self.send("502 5.5.2 Error: command not recognized")


def serve(sock):
    try:
        Session(sock).run()
    except (EOFError, OSError, ssl.SSLError):
        pass
    finally:
        try:
            sock.close()
        except OSError:
            pass


def main():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(PORT)))
    listener.listen(16)
    while True:
        sock, _ = listener.accept()
        threading.Thread(target=serve, args=(sock,), daemon=True).start()


if __name__ == "__main__":
    main()
