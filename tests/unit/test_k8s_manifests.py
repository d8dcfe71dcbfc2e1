"""examples/k8s/: every Kubernetes object validates (strictly: no unknown field) against the
Kubernetes schemas of kubernetes-validate; the custom resources validate as a whole against
their owners' CRDs (KubeRay's RayJob, Argo's Workflow: tests/specs/, from tools/crd_schemas.py),
no unknown field either (a cluster prunes one silently), and their pod templates and containers
validate as the core kinds they are; every pod that runs bulkinfer gets the S3 credentials and
the grace period; the exit code the manifests retry on is the one a stopped
`bulkinfer run` returns (tests/e2e/test_run_contract.py and test_spark_faults.py send the
SIGTERM); the grace period covers the Spark backend's wait for its running shards; the job file
they mount loads."""

from __future__ import annotations

import copy
import gzip
import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bulkinfer import load_config
from bulkinfer.core.errors import Interrupted
from bulkinfer.runners.spark import _STOP_GRACE_S

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "examples" / "k8s"
SPECS = ROOT / "tests" / "specs"
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


def crd_errors(obj: dict) -> list[str]:
    """Where a custom resource breaks its CRD's schema (the version its apiVersion names): the
    schema's own checks, and any field the schema does not have."""
    from jsonschema import Draft7Validator

    name = {"RayJob": "rayjob", "Workflow": "workflow"}[obj["kind"]]
    crd = json.loads(gzip.decompress((SPECS / f"{name}.schema.json.gz").read_bytes()))
    group, version = obj["apiVersion"].split("/")
    assert group == crd["group"] and obj["kind"] == crd["kind"]
    schema = crd["versions"][version]
    found = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in Draft7Validator(schema).iter_errors(obj)]
    return found + _unknown(obj, schema, "")


def _unknown(value: Any, schema: dict, at: str) -> list[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict) and "properties" in schema:
        found = [f"{at}{k}: not a field of the CRD" for k in value if k not in schema["properties"]]
        return found + [e for k, v in value.items() if k in schema["properties"]
                        for e in _unknown(v, schema["properties"][k], f"{at}{k}.")]  # fmt: skip
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return [e for k, v in value.items() for e in _unknown(v, schema["additionalProperties"], f"{at}{k}.")]
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [e for i, v in enumerate(value) for e in _unknown(v, schema["items"], f"{at}{i}.")]
    return []


@pytest.mark.parametrize("name", ["rayjob.yaml", "workflow.yaml"])
def test_the_custom_resources_validate_against_their_crds(name):
    (obj,) = _docs(name)
    assert crd_errors(obj) == []


def test_the_crd_check_catches_a_misspelt_field_and_a_wrong_type():
    (rayjob,) = _docs("rayjob.yaml")
    broken = copy.deepcopy(rayjob)
    broken["spec"]["shutdownAfterJobFinished"] = broken["spec"].pop("shutdownAfterJobFinishes")
    broken["spec"]["backoffLimit"] = "3"
    broken["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 2
    assert crd_errors(broken) == [
        "spec.backoffLimit: '3' is not of type 'integer'",
        "spec.shutdownAfterJobFinished: not a field of the CRD",
        "spec.rayClusterSpec.workerGroupSpecs.0.replica: not a field of the CRD",
    ]
    (workflow,) = _docs("workflow.yaml")
    broken = copy.deepcopy(workflow)
    broken["spec"]["templates"][0]["retryStrategy"]["retrypolicy"] = "Always"
    assert crd_errors(broken) == ["spec.templates.0.retryStrategy.retrypolicy: not a field of the CRD"]


def _bulkinfer_pods() -> list[tuple[str, dict, dict]]:
    """(where, pod spec, container) of every container that runs bulkinfer in examples/k8s/."""
    (job,) = [d for d in _docs("job.yaml") if d["kind"] == "Job"]
    (rayjob,) = _docs("rayjob.yaml")
    (workflow,) = _docs("workflow.yaml")
    cluster = rayjob["spec"]["rayClusterSpec"]
    pods = [("job", job["spec"]["template"]["spec"]), ("ray head", cluster["headGroupSpec"]["template"]["spec"]),
            *((f"ray {g['groupName']}", g["template"]["spec"]) for g in cluster["workerGroupSpecs"])]  # fmt: skip
    (template,) = workflow["spec"]["templates"]
    pods.append(("argo step", {**yaml.safe_load(template["podSpecPatch"]), "containers": [template["container"]]}))
    return [(where, pod, c) for where, pod in pods for c in pod["containers"]]


def test_every_pod_that_runs_bulkinfer_has_the_s3_credentials_and_the_grace_period():
    found = _bulkinfer_pods()
    assert [w for w, _p, _c in found] == ["job", "ray head", "ray cpu", "argo step"]
    for where, pod, container in found:
        env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") for e in container["env"]}
        assert env.get("AWS_ACCESS_KEY_ID") == env.get("AWS_SECRET_ACCESS_KEY") == "bulkinfer-s3", where
        assert pod.get("terminationGracePeriodSeconds", 30) >= 2 * _STOP_GRACE_S, where


def test_the_rayjobs_ray_is_the_one_the_project_installs():
    import ray

    (rayjob,) = _docs("rayjob.yaml")
    pinned = {re.split(r"[\[=]", r)[0]: r.split("==")[1] for r in tomllib.loads((ROOT / "pyproject.toml").read_text())
              ["project"]["optional-dependencies"]["ray"]}  # fmt: skip
    assert rayjob["spec"]["rayClusterSpec"]["rayVersion"] == pinned["ray"] == ray.__version__


@pytest.mark.skipif(not (ROOT.parent / "shared" / "specs").is_dir(), reason="the CRDs are not beside the checkout")
def test_the_vendored_crd_schemas_are_the_published_ones():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "crd_schemas.py"), "--check"],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
