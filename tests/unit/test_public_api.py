import bulkinfer


def test_public_names_are_pinned():
    assert sorted(bulkinfer.__all__) == sorted(
        [
            "Adapter",
            "BulkinferError",
            "ClusterError",
            "ConfigError",
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
