"""An independent reader of a TLS report mail (RFC 8460 §5.3 and §4.4), for the tests.

Reads the mail on standard input with Python's email package, finds the
application/tlsrpt+gzip part, inflates it and checks the report's JSON field by field
against the RFC's description. Prints the report's JSON on success; exits 1 naming the
first thing wrong.

Usage: tlsrpt_check.py < mail
"""

import email
import email.policy
import gzip
import json
import sys

RESULT_TYPES = {
    "starttls-not-supported", "certificate-host-mismatch", "certificate-expired",
    "certificate-not-trusted", "validation-failure", "tlsa-invalid", "dnssec-invalid",
    "dane-required", "sts-policy-fetch-error", "sts-policy-invalid", "sts-webpki-invalid",
}


def fail(why):
    print(why, file=sys.stderr)
    sys.exit(1)


msg = email.message_from_binary_file(sys.stdin.buffer, policy=email.policy.default)
if msg.get_content_type() != "multipart/report" or msg.get_param("report-type") != "tlsrpt":
    fail(f"not multipart/report; report-type=tlsrpt: {msg.get_content_type()}")
for field in ("TLS-Report-Domain", "TLS-Report-Submitter"):
    if not msg.get(field):
        fail(f"no {field} field")
if not str(msg["Subject"]).startswith("Report Domain: "):
    fail(f"subject {msg['Subject']!r}")
parts = [p for p in msg.walk() if p.get_content_type() == "application/tlsrpt+gzip"]
if len(parts) != 1:
    fail(f"{len(parts)} application/tlsrpt+gzip parts")
name = parts[0].get_filename() or ""
if not name.endswith(".json.gz") or name.count("!") < 3:
    fail(f"attachment name {name!r}")
report = json.loads(gzip.decompress(parts[0].get_payload(decode=True)))

for key, kind in (("organization-name", str), ("contact-info", str), ("report-id", str),
                  ("date-range", dict), ("policies", list)):
    if not isinstance(report.get(key), kind):
        fail(f"{key} missing or not {kind.__name__}")
for key in ("start-datetime", "end-datetime"):
    value = report["date-range"].get(key, "")
    if not (isinstance(value, str) and value.endswith("Z") and "T" in value):
        fail(f"date-range {key} {value!r} is not an RFC 3339 UTC time")
for p in report["policies"]:
    policy = p.get("policy", {})
    if policy.get("policy-type") not in ("sts", "tlsa", "no-policy-found"):
        fail(f"policy-type {policy.get('policy-type')!r}")
    if not isinstance(policy.get("policy-domain"), str):
        fail("policy-domain missing")
    if policy["policy-type"] != "no-policy-found" and not isinstance(policy.get("policy-string"), list):
        fail("policy-string missing for a policy")
    summary = p.get("summary", {})
    for key in ("total-successful-session-count", "total-failure-session-count"):
        if not isinstance(summary.get(key), int) or summary[key] < 0:
            fail(f"summary {key}")
    failed = 0
    for d in p.get("failure-details", []):
        if d.get("result-type") not in RESULT_TYPES:
            fail(f"result-type {d.get('result-type')!r}")
        if not isinstance(d.get("failed-session-count"), int):
            fail("failed-session-count missing")
        failed += d["failed-session-count"]
    if failed > summary["total-failure-session-count"]:
        fail("failure details exceed the summary")
print(json.dumps(report))
