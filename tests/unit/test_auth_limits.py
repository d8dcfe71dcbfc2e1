"""Per-key limits (``serve.api_keys_file``: rps=, rows_per_s=) on a clock the test drives by
hand: the figures do not depend on how busy the machine is."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from bulkinfer.serve.auth import KeyRing
from bulkinfer.serve.validation import ApiError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _request(key: str) -> Request:
    return Request({"type": "http", "headers": [(b"authorization", f"Bearer {key}".encode())]})


@pytest.fixture
def ring(tmp_path):
    (tmp_path / "keys.txt").write_text("req-key-1 id=search rps=2\nrow-key-2 id=backfill rows_per_s=5\n")
    clock = Clock()
    return KeyRing(str(tmp_path / "keys.txt"), clock=clock), clock


def test_a_key_gets_a_seconds_worth_of_requests_then_429_until_the_bucket_refills(ring):
    keys, clock = ring
    keys.authorize(_request("req-key-1"))
    keys.authorize(_request("req-key-1"))  # two requests: a second's worth at rps=2
    with pytest.raises(ApiError) as err:
        keys.authorize(_request("req-key-1"))
    assert err.value.status == 429 and "key search is over its limit (rps=2); retry after 0.50 s" in str(err.value)
    clock.now += 0.25  # half a request refilled: still refused, a quarter second to go
    with pytest.raises(ApiError, match=r"retry after 0\.25 s"):
        keys.authorize(_request("req-key-1"))
    clock.now += 0.25
    keys.authorize(_request("req-key-1"))  # one token back: one request passes


def test_rows_are_charged_per_request_and_a_large_request_leaves_the_key_in_debt(ring):
    keys, clock = ring
    request = _request("row-key-2")
    keys.authorize(request)  # no request rate for this key
    keys.charge_rows(request, 4)
    with pytest.raises(ApiError, match=r"over its limit \(rows_per_s=5\); retry after 0\.60 s"):
        keys.charge_rows(request, 4)  # 1 row left, 4 asked: 3 rows at 5/s
    clock.now += 1.0
    keys.charge_rows(request, 12)  # over a second's worth: passes on a full bucket, leaves 7 rows of debt
    with pytest.raises(ApiError, match=r"retry after 1\.60 s"):  # 7 rows of debt and 1 row asked: 8 rows at 5/s
        keys.charge_rows(request, 1)


def test_buckets_survive_a_reload_for_the_keys_still_there(ring, tmp_path):
    keys, _clock = ring
    for _ in range(2):
        keys.authorize(_request("req-key-1"))
    (tmp_path / "keys.txt").write_text("req-key-1 id=search rps=2\n")
    assert keys.reload() == 1
    with pytest.raises(ApiError, match="over its limit"):
        keys.authorize(_request("req-key-1"))  # the reload did not hand out a fresh bucket
    with pytest.raises(ApiError) as err:
        keys.authorize(_request("row-key-2"))
    assert err.value.status == 401
