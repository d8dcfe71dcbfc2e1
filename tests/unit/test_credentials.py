from __future__ import annotations

import pytest

from bulkinfer import load_config
from bulkinfer.core.credentials import MASK, find_masked, redact_url, scrub
from bulkinfer.core.errors import ConfigError


def test_scrub_masks_passwords_and_secret_options_and_keeps_everything_else():
    config = {
        "sink": {
            "path": "s3://bucket/out",
            "storage_options": {
                "endpoint_url": "http://127.0.0.1:9000",
                "key": "AKIA123",
                "secret": "s3cr3t",
                "anon": False,
                "client_kwargs": {"region_name": "eu-west-1", "aws_session_token": "tok"},
            },
        },
        "export": [
            {"kind": "redis", "url": "redis://:hunter2@cache:6379/0", "key": "emb:{id}"},
            {"kind": "postgres", "dsn": "postgresql://app:pa:ss@db:5432/x"},
            {"kind": "postgres", "dsn": "host=db user=app password='a b' dbname=x"},
            {"kind": "folder", "path": "az://c/p", "storage_options": {"account_name": "acct", "sas_token": "sv=1"}},
        ],
        "lineage": {"url": "https://user:pw@marquez:5000"},
        "source": {"paths": ["https://example.org/a.parquet"], "shard_rows": 100},
    }
    got = scrub(config)
    opts = got["sink"]["storage_options"]
    assert opts == {
        "endpoint_url": "http://127.0.0.1:9000",
        "key": MASK,
        "secret": MASK,
        "anon": False,
        "client_kwargs": {"region_name": "eu-west-1", "aws_session_token": MASK},
    }
    assert got["export"][0] == {"kind": "redis", "url": f"redis://:{MASK}@cache:6379/0", "key": "emb:{id}"}
    assert got["export"][1]["dsn"] == f"postgresql://app:{MASK}@db:5432/x"
    assert got["export"][2]["dsn"] == f"host=db user=app password={MASK} dbname=x"
    assert got["export"][3]["storage_options"] == {"account_name": "acct", "sas_token": MASK}
    assert got["lineage"]["url"] == f"https://user:{MASK}@marquez:5000"
    assert got["source"] == config["source"]
    assert config["sink"]["storage_options"]["secret"] == "s3cr3t"  # the original is untouched
    assert find_masked(got) == "sink.storage_options.key"
    assert find_masked(got["export"]) == "[0].url"
    assert find_masked(config) is None
    assert redact_url("redis://:hunter2@cache:6379/0") == "redis://cache:6379/0"


def test_a_config_read_back_with_a_masked_credential_is_refused_naming_the_field():
    base = {"source": {"paths": ["in"]}, "model": {"name": "m"},
            "export": [{"kind": "redis", "url": f"redis://:{MASK}@cache:6379/0"}]}  # fmt: skip
    with pytest.raises(ConfigError, match=r"^export\[0\]\.url: the output's job.json keeps no credentials"):
        load_config(base=base)
    cfg = load_config(base=scrub({"source": {"paths": ["in"]}, "model": {"name": "m"}}))
    assert cfg.source.paths == ["in"]
