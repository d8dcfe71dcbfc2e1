"""``bulkinfer serve`` over TLS with an audit log, as a real process called by a real client;
and the warning when it listens beyond loopback without API keys."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import ssl
import subprocess
import sys
import time

import httpx

from helpers import tabular_table, train_classifier

KEYS = ["alpha-key-0123456789", "beta-key-9876543210"]
CANARY = "CANARY-7f3a9c"


def self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())  # fmt: skip
    (tmp_path / "key.pem").write_bytes(pem)
    return tmp_path / "cert.pem", tmp_path / "key.pem"


def start(args, cwd):
    cmd = [sys.executable, "-m", "bulkinfer", "serve", "--port", "0", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


def url_of(proc: subprocess.Popen, scheme: str) -> str:
    """The URL the server prints once it listens."""
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(rf"at ({scheme}://127\.0\.0\.1:\d+)", line)
        if m:
            return m.group(1)
    raise AssertionError(f"the server did not start: exit {proc.wait()}")


def test_tls_and_the_audit_log(tmp_path):
    model = train_classifier(tmp_path / "m.joblib")
    cert, key = self_signed(tmp_path)
    (tmp_path / "keys.txt").write_text("\n".join(KEYS) + "\n")
    proc = start(["-m", str(model), "--set", "serve.api_keys_file='keys.txt'", "--set", f"serve.tls_cert='{cert}'",
                  "--set", f"serve.tls_key='{key}'", "--set", "serve.audit_log='audit.jsonl'"], tmp_path)  # fmt: skip
    try:
        url = url_of(proc, "https")
        ctx = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(verify=ctx, timeout=30) as client:
            deadline = time.monotonic() + 60
            while client.get(f"{url}/readyz").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            rows = [{k: v for k, v in r.items() if k in ("x1", "x2", "x3")} for r in tabular_table(2).to_pylist()]
            ok = client.post(f"{url}/v1/predict", json={"rows": rows}, headers={"Authorization": f"Bearer {KEYS[1]}"})
            assert ok.status_code == 200 and len(ok.json()["rows"]) == 2
            denied = client.post(f"{url}/v1/predict", json={"rows": rows}, headers={"Authorization": "Bearer nope"})
            assert denied.status_code == 401
            bad = client.post(f"{url}/v1/predict", json={"rows": [{"x1": CANARY, "x2": 1, "x3": 2}]},
                              headers={"Authorization": f"Bearer {KEYS[0]}"})  # fmt: skip
            assert bad.status_code == 422
        # plain HTTP to the TLS port gets no answer a client could take for one
        try:
            plain = httpx.get(url.replace("https", "http") + "/healthz", timeout=5)
            assert plain.status_code >= 400
        except httpx.HTTPError:
            pass
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    predicts = [x for x in lines if x["route"] == "predict"]
    assert [x["status"] for x in predicts] == [200, 401, 422]
    import hashlib

    assert predicts[0]["key_id"] == "key-" + hashlib.sha256(KEYS[1].encode()).hexdigest()[:12]
    assert predicts[0]["rows"] == 2 and predicts[1]["key_id"] is None and predicts[0]["client"] == "127.0.0.1"
    assert all(x["latency_ms"] >= 0 and x["method"] == "POST" for x in predicts)
    text = (tmp_path / "audit.jsonl").read_text()
    assert not any(k in text for k in KEYS) and CANARY not in text  # no key, no request content


def test_listening_beyond_loopback_without_keys_warns(tmp_path):
    model = train_classifier(tmp_path / "m.joblib")
    proc = start(["-m", str(model), "--host", "0.0.0.0"], tmp_path)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert "serving on 0.0.0.0 without serve.api_keys_file" in first, first
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    half = start(["-m", str(model), "--set", "serve.tls_cert='cert.pem'"], tmp_path)
    _, err = half.communicate(timeout=60)
    assert half.returncode == 1 and "serve.tls_cert and serve.tls_key go together" in err


def test_per_key_limits_and_keys_reloaded_on_sighup(tmp_path):
    import signal

    model = train_classifier(tmp_path / "m.joblib")
    keys = tmp_path / "keys.txt"
    # rates so low that no machine is slow enough to refill a bucket within the test (the arithmetic
    # of the buckets is tested on a hand-driven clock in tests/unit/test_auth_limits.py)
    keys.write_text("# search team: a request per 100 s; backfill: 5 rows per 100 s\nreq-key-1 id=search rps=0.01\n"
                    "row-key-2 id=backfill rows_per_s=0.05\n")  # fmt: skip
    proc = start(["-m", str(model), "--set", "serve.api_keys_file='keys.txt'", "--set",
                  "serve.audit_log='audit.jsonl'"], tmp_path)  # fmt: skip
    try:
        url = url_of(proc, "http")
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        rows = [{k: v for k, v in r.items() if k in ("x1", "x2", "x3")} for r in tabular_table(4).to_pylist()]

        def post(key, body_rows):
            return httpx.post(f"{url}/v1/predict", json={"rows": body_rows}, headers={"Authorization": f"Bearer {key}"})

        burst = [post("req-key-1", rows[:1]).status_code for _ in range(3)]
        assert burst == [200, 429, 429]  # a full bucket lets one request through, then 429
        limited = post("req-key-1", rows[:1])
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 90
        assert "key search is over its limit (rps=0.01)" in limited.json()["error"]["message"]
        assert post("row-key-2", rows).status_code == 200  # 4 rows on a full bucket: passes, leaves debt
        over = post("row-key-2", rows)
        assert over.status_code == 429 and "rows_per_s=0.05" in over.json()["error"]["message"]
        assert post("new-key-3", rows[:1]).status_code == 401
        keys.write_text("new-key-3 id=newcomer\nrow-key-2 id=backfill rows_per_s=5\n")  # req-key-1 revoked
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while post("new-key-3", rows[:1]).status_code != 200:
            assert time.monotonic() < deadline, "keys were not reloaded"
            time.sleep(0.1)
        assert post("req-key-1", rows[:1]).status_code == 401
        assert proc.poll() is None  # reloaded, not restarted
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ids = {json.loads(x)["key_id"] for x in (tmp_path / "audit.jsonl").read_text().splitlines()}
    assert {"search", "backfill", "newcomer"} <= ids
