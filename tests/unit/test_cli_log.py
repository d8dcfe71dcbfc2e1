from __future__ import annotations

import logging

import pytest

from bulkinfer.cli import LineFormat

SITE = "/x/.venv/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    ("name", "path", "line"),
    [
        ("bulkinfer", "job.py", "bulkinfer: disk full"),
        ("bulkinfer.runners.ray", "ray.py", "bulkinfer: disk full"),
        ("ray.data._internal", f"{SITE}/ray/data/x.py", "bulkinfer: [ray] disk full"),
        ("root", f"{SITE}/onnxruntime/quantization/quantize.py", "bulkinfer: [onnxruntime] disk full"),
        ("root", f"{SITE}/six.py", "bulkinfer: [six] disk full"),
        ("root", "/home/me/job.py", "bulkinfer: [python] disk full"),
    ],
)
def test_bulkinfers_lines_are_its_own_and_a_librarys_name_the_library(name, path, line):
    record = logging.LogRecord(name, logging.WARNING, path, 1, "disk %s", ("full",), None)
    assert LineFormat().format(record) == line
