import bulkinfer


def test_public_names_are_pinned():
    assert sorted(bulkinfer.__all__) == sorted(
        [
            "Adapter",
            "BulkinferError",
            "CheckFailed",
            "ClusterError",
            "ConfigError",
            "CostLimitReached",
            "ErrorBudgetExceeded",
            "ImageAdapter",
            "Interrupted",
            "JobConfig",
            "JobMismatchError",
            "LedgerError",
            "LockedError",
            "ModelError",
            "OutputError",
            "QualityGateError",
            "RunResult",
            "SetupContext",
            "SourceError",
            "__version__",
            "inspect_output",
            "load_config",
            "run_job",
        ]
    )


def test_import_is_light():
    import subprocess
    import sys

    code = "import bulkinfer, sys; print(sorted(m for m in ('torch','onnxruntime','ray','transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_error_exit_codes():
    assert bulkinfer.BulkinferError.exit_code == 1
    assert bulkinfer.Interrupted.exit_code == 75
    assert issubclass(bulkinfer.LockedError, bulkinfer.OutputError)


def test_every_error_is_public_and_documented():
    """``run_job`` raises only BulkinferError subclasses: each one is importable from ``bulkinfer``
    and named, with its exit code, in docs/python-api.md."""
    import inspect
    from pathlib import Path

    from bulkinfer.core import errors

    classes = {n for n, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.BulkinferError)}
    assert len(classes) >= 14
    assert classes <= set(bulkinfer.__all__)
    doc = (Path(bulkinfer.__file__).parents[2] / "docs" / "python-api.md").read_text()
    section = doc.split("## Errors", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("`")[1]: line for line in section.splitlines() if line.startswith("| `")}
    assert set(rows) == classes
    for name in classes:
        assert f"| {getattr(errors, name).exit_code} |" in rows[name], name
