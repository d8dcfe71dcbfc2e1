"""examples/k8s/: every Kubernetes object validates (strictly: no unknown field) against the
Kubernetes schemas of kubernetes-validate; the custom resources' pod templates and containers
validate as the core kinds they are; the exit code the manifests retry on is the one a stopped
`bulkinfer run` returns (tests/e2e/test_run_contract.py and test_spark_faults.py send the
SIGTERM); the grace period covers the Spark backend's wait for its running shards; the job file
they mount loads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from bulkinfer import load_config
from bulkinfer.core.errors import Interrupted
from bulkinfer.runners.spark import _STOP_GRACE_S

K8S = Path(__file__).resolve().parents[2] / "examples" / "k8s"
VERSION = kubernetes_validate.latest_version()


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def _valid(obj: dict) -> None:
    kubernetes_validate.validate(obj, VERSION, strict=True)


def _pod(spec: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": spec}


def _job_file(tmp_path: Path) -> Path:
    (config_map,) = [d for d in _docs("job.yaml") if d["kind"] == "ConfigMap"]
    path = tmp_path / "job.toml"
    path.write_text(config_map["data"]["job.toml"])
    return path


def test_the_job_validates_and_restarts_a_stopped_pod_without_counting_a_failure(tmp_path):
    docs = _docs("job.yaml")
    assert [d["kind"] for d in docs] == ["ConfigMap", "Job"]
    for d in docs:
        _valid(d)
    job = docs[1]["spec"]
    (rule,) = [r for r in job["podFailurePolicy"]["rules"] if "onExitCodes" in r]
    assert rule["action"] == "Ignore" and rule["onExitCodes"]["values"] == [Interrupted.exit_code]
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] >= 2 * _STOP_GRACE_S
    (container,) = pod["containers"]
    assert rule["onExitCodes"]["containerName"] == container["name"]
    (mount,) = container["volumeMounts"]
    assert container["command"] == ["bulkinfer", "run", f"{mount['mountPath']}/job.toml"]
    cfg = load_config(_job_file(tmp_path))
    assert cfg.sink.path.startswith("s3://")  # every node reaches the ledger: a new pod resumes


def test_a_broken_manifest_is_caught():
    """The check can fail: a misspelt field and a wrong type are both refused."""
    job = _docs("job.yaml")[1]
    job["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 120
    with pytest.raises(kubernetes_validate.ValidationError):
        _valid(job)
    job = _docs("job.yaml")[1]
    job["spec"]["backoffLimit"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        _valid(job)


def test_the_rayjob_pod_templates_validate_and_its_entrypoint_loads(tmp_path):
    (rayjob,) = _docs("rayjob.yaml")
    assert rayjob["apiVersion"] == "ray.io/v1" and rayjob["kind"] == "RayJob"
    spec = rayjob["spec"]
    cluster = spec["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    for template in templates:
        _valid({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template})
    head = cluster["headGroupSpec"]["template"]["spec"]
    assert head["terminationGracePeriodSeconds"] >= 2 * _STOP_GRACE_S
    assert spec["backoffLimit"] >= 1 and spec["shutdownAfterJobFinishes"] is True
    args = shlex.split(spec["entrypoint"])
    assert args[:3] == ["bulkinfer", "run", "/etc/bulkinfer/job.toml"]
    assert head["containers"][0]["volumeMounts"][0]["mountPath"] == "/etc/bulkinfer"
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    overrides = {"execution.backend": args[args.index("--backend") + 1], **dict(s.split("=", 1) for s in sets)}
    cfg = load_config(_job_file(tmp_path), overrides=overrides)
    assert cfg.execution.backend == "ray" and cfg.execution.ray_address == "auto"


def test_the_argo_step_retries_exit_75_only(tmp_path):
    (workflow,) = _docs("workflow.yaml")
    assert workflow["apiVersion"] == "argoproj.io/v1alpha1" and workflow["kind"] == "Workflow"
    spec = workflow["spec"]
    (template,) = spec["templates"]
    _valid(_pod({"containers": [template["container"]], "volumes": spec["volumes"],
                 **yaml.safe_load(template["podSpecPatch"])}))  # fmt: skip
    retry = template["retryStrategy"]
    assert re.fullmatch(r"asInt\(lastRetry\.exitCode\) == (\d+)", retry["expression"]).group(1) == str(
        Interrupted.exit_code
    )
    assert int(retry["limit"]) >= 1
    assert yaml.safe_load(template["podSpecPatch"])["terminationGracePeriodSeconds"] >= 2 * _STOP_GRACE_S
    assert template["container"]["command"] == ["bulkinfer", "run", "/etc/bulkinfer/job.toml"]
