"""Dagster definitions: the catalog's embeddings as an asset materialized by a bulkinfer job.

    dagster dev -f examples/dagster/definitions.py

The job file's output is the asset; each materialization records rows, cost and the output's
path. A stopped run (exit 75) is retried and resumes.
"""

from __future__ import annotations

from pathlib import Path

from dagster import Definitions

from bulkinfer.dagster import bulkinfer_asset

JOB = Path(__file__).resolve().parents[1] / "catalog.toml"

catalog_embeddings = bulkinfer_asset(job=JOB, name="catalog_embeddings", group_name="recommendations")

defs = Definitions(assets=[catalog_embeddings])
