#!/usr/bin/env python3
"""Schemathesis against a live gateway (issue 17).

Starts its own redis-server and a debug `sluice serve` on free loopback
ports, with an admin token, a webhook secret and a config of one room
(`default`, admitting its burst of one, then nobody) and one event
(`demo`). Solves the proof of work (API.md, "Proof of work") to get a
real admission token and a real queue token of the room,
then runs `schemathesis run` on the gateway's own OpenAPI document with
those tokens given per security scheme (tests/api/schemathesis.toml).
Exits with schemathesis's status: any finding fails. Stops what it started.

Usage: tests/api/schemathesis.py [--max-examples N] [--max-time S]
(the sluice binary: target/debug/sluice, or $SLUICE_BIN).
"""

import argparse
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = """
trusted_proxies = ["127.0.0.1/32"]
[limits]
holds_per_visitor_per_min = 600

[[rooms]]
id = "default"
paths = []
rate_per_sec = 0
burst = 1
join_limit_per_prefix_per_min = 0
puzzles = 1
difficulty_floor_bits = 2
difficulty_ceiling_bits = 4
attack_min_solve = "0s"

[[events]]
id = "demo"
room = "default"
total = 1000000
cart_limit = 4
hold_ttl = "5m"
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(method, url, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            return res.status, json.loads(res.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def leading_zero_bits(digest):
    bits = 0
    for b in digest:
        if b == 0:
            bits += 8
            continue
        return bits + 8 - b.bit_length()
    return bits


def solve(challenge, puzzles, bits):
    out = []
    for i in range(puzzles):
        n = 0
        while leading_zero_bits(hashlib.sha256(f"{challenge}:{i}:{n}".encode()).digest()) < bits:
            n += 1
        out.append(str(n))
    return out


def join(base, room):
    status, c = call("POST", f"{base}/_sluice/rooms/{room}/challenge")
    assert status == 200, (status, c)
    sols = solve(c["challenge"], c["puzzles"], c["difficulty_bits"])
    return call("POST", f"{base}/_sluice/rooms/{room}/join",
                {"challenge": c["challenge"], "solutions": sols})


def wait_for(proc, needle, deadline_s):
    """The first stdout line of `proc` containing `needle`."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                raise SystemExit(f"process exited ({proc.returncode}) before printing {needle!r}")
            continue
        if needle in line:
            return line
    raise SystemExit(f"no {needle!r} within {deadline_s} s")


def drain(proc):
    """Keeps reading `proc`'s stdout, so a full pipe never blocks it."""
    threading.Thread(target=proc.stdout.read, daemon=True).start()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-examples", type=int, default=40)
    ap.add_argument("--max-time", type=int, default=180)
    ap.add_argument("extra", nargs="*", help="more arguments for `schemathesis run`")
    args = ap.parse_args()

    binary = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "target", "debug", "sluice"))
    st = shutil.which("schemathesis") or shutil.which("st")
    if not st:
        raise SystemExit("schemathesis is not installed (pip install schemathesis)")
    tmp = tempfile.mkdtemp(prefix="sluice-st-")
    procs = []
    try:
        redis_port = free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.PIPE, text=True)
        procs.append(redis)
        wait_for(redis, "Ready to accept connections", 20)
        drain(redis)

        cfg = os.path.join(tmp, "sluice.toml")
        with open(cfg, "w") as f:
            f.write(CONFIG)
        admin = secrets.token_urlsafe(24)
        webhook = secrets.token_urlsafe(24)
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "error"))
        gw = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{free_port()}",
             "--redis", f"redis://127.0.0.1:{redis_port}/", "--admin-token", admin,
             "--pow-secret", secrets.token_urlsafe(24), "--webhook-secret", webhook,
             "--load-stock", "--config", cfg],
            stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, "sluice.log"), "w"),
            text=True, env=env)
        procs.append(gw)
        line = wait_for(gw, "listening on", 60)
        base = line.split("listening on ", 1)[1].split()[0].rstrip("/")
        drain(gw)

        # Room `default` admits its burst (one) at once, then nobody (rate
        # 0): the first join is admitted, a later one waits.
        admission = queue = None
        for _ in range(6):
            status, answer = join(base, "default")
            if status == 200 and answer.get("state") == "admitted":
                admission = admission or answer["admission_token"]
            elif status == 201 and answer.get("queue_token"):
                queue = queue or answer["queue_token"]
            else:
                raise SystemExit(f"join: {status} {answer}")
            if admission and queue:
                break
        assert admission and queue, "no admission token or no queue token"

        env = dict(os.environ,
                   SLUICE_ST_ADMIN_TOKEN=admin,
                   SLUICE_ST_ADMISSION_TOKEN=admission,
                   SLUICE_ST_QUEUE_TOKEN=queue,
                   SLUICE_ST_WEBHOOK_SECRET=webhook,
                   SLUICE_ST_HOOKS=os.path.join(ROOT, "tests", "api", "schemathesis_hooks.py"))
        cmd = [st, "--config-file", os.path.join(ROOT, "tests", "api", "schemathesis.toml"),
               "run", f"{base}/_sluice/openapi.json", "--url", base,
               "--max-examples", str(args.max_examples), "--max-time", str(args.max_time),
               "--request-timeout", "60", "--seed", os.environ.get("SLUICE_ST_SEED", "17"),
               "--no-color", *args.extra]
        print("+", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, env=env, cwd=tmp)
        if gw.poll() is not None:
            print(f"the gateway died during the run (status {gw.returncode})", file=sys.stderr)
            rc = rc or 1
        if rc != 0:
            with open(os.path.join(tmp, "sluice.log")) as f:
                tail = f.read()[-4000:]
            print("--- gateway log (tail) ---\n" + tail, file=sys.stderr)
        return rc
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
