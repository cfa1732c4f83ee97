"""Schemathesis hooks of tests/api/schemathesis.py.

The payment webhook is signed: a generated `Sluice-Signature` of the right
shape is replaced by the real HMAC of the body actually sent (API.md:
`t=<unix>,v1=<hex HMAC-SHA256(secret, t + "." + raw body)>`), so the
webhook's positive cases reach the store rather than stopping at 400
`signature_invalid`. A signature of the wrong shape is sent as generated.

Every request comes from a network of its own (`X-Forwarded-For`, the
gateway trusting the loopback as its proxy): the tool's deliberate 401s
would otherwise earn its network the admin lockout within a second and
leave every admin operation answering 429, untested. The lockout itself
is tested in tests/tests/control.rs.

A join carries no token: its documented security is none (a visitor that
holds a queue token gets its place back before the body is read, which
the document says in words), and the queue token configured for the
status poll must not turn every join into that replay.
"""

import hashlib
import hmac
import json
import os
import itertools
import re
import time

import schemathesis

NETWORKS = itertools.count()
SHAPE = re.compile(r"^t=[0-9]{1,20}(, ?v1=[0-9a-f]{64}){1,8}$")


@schemathesis.hook
def before_call(context, case, kwargs):
    if case.headers is None:
        case.headers = {}
    # A counter, not `random`: Hypothesis seeds `random` for each example.
    n = next(NETWORKS)
    case.headers["X-Forwarded-For"] = "10.%d.%d.1" % (n >> 8 & 255, n & 255)
    if case.path == "/_sluice/rooms/{room}/join":
        case.headers.pop("Authorization", None)
    if case.path == "/_sluice/rooms/{room}/challenge":
        # A body of only whitespace is an empty body to the challenge (the
        # document says so: clients older than invites send none), not the
        # invalid JSON the negative phase means it to be: make it one.
        data = kwargs.get("data")
        if isinstance(data, (bytes, str)) and len(data) > 0 and not data.strip():
            kwargs["data"] = (data.encode() if isinstance(data, str) else data) + b"~"
    if case.path != "/_sluice/webhooks/payment" or not case.headers:
        return
    sig = case.headers.get("Sluice-Signature")
    if not isinstance(sig, str) or not SHAPE.match(sig):
        return
    try:
        body = json.dumps(case.body, allow_nan=False).encode()
    except (TypeError, ValueError):
        return
    t = str(int(time.time()))
    secret = os.environ["SLUICE_ST_WEBHOOK_SECRET"].encode()
    mac = hmac.new(secret, t.encode() + b"." + body, hashlib.sha256).hexdigest()
    case.headers["Sluice-Signature"] = f"t={t},v1={mac}"
    kwargs["data"] = body
