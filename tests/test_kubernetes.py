"""The manifests in deploy/kubernetes/, checked without a cluster.

Every core Kubernetes object is validated against the Kubernetes API's own JSON schemas (strict:
an unknown or misspelt field fails), as bundled by kubernetes-validate, offline, for the oldest
Kubernetes the manifests support and the newest the package knows. KServe's InferenceService is
a custom resource whose schema is not bundled: its predictor is checked field by field against
KServe's API, and the pod spec it embeds is validated as a core Pod. Then what no schema knows:
the SMSO_* variables are settings of the service, the probes name its health routes, the ports
agree, the grace period covers the drain, and the autoscaler's metric is one the service exports.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from service.app import create_app
from service.core.settings import DEFAULT_MODEL, Settings
from service.telemetry.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "kubernetes"

#: 1.30: the oldest these manifests run on (the preStop `sleep` action is on by default from
#: 1.30); 1.37: the newest kubernetes-validate>=1.37 bundles (fields deprecated and removed).
KUBERNETES_VERSIONS = ("1.30", "1.37")

#: Custom resources: not in the Kubernetes schemas, checked by the tests below instead.
KSERVE = "serving.kserve.io/v1beta1"
CUSTOM = {(KSERVE, "InferenceService")}

#: Settings whose values are paths on the cluster, not here: their values are not parsed.
CLUSTER_PATHS = {"SMSO_MODEL_PATH", "SMSO_MODEL_REPOSITORY"}

#: Variables that KServe reads from its predictor container (the service ignores them).
KSERVE_VARIABLES = {"PROTOCOL", "STORAGE_URI"}

#: KServe's ComponentExtensionSpec (pkg/apis/serving/v1beta1/component.go): the predictor's
#: own fields; the rest of a custom predictor is a core PodSpec.
KSERVE_COMPONENT_FIELDS = {
    "minReplicas",
    "maxReplicas",
    "scaleTarget",
    "scaleMetric",
    "containerConcurrency",
    "timeout",
    "canaryTrafficPercent",
    "logger",
    "batcher",
    "labels",
    "annotations",
    "deploymentStrategy",
}

#: What Knative serving refuses in a revision (it drains through its queue-proxy and sets the
#: grace period from the timeout itself).
KNATIVE_REFUSED_CONTAINER = {"lifecycle"}
KNATIVE_REFUSED_POD = {"terminationGracePeriodSeconds"}

LIVENESS_ROUTES = {"/healthz", "/v2/health/live"}
READINESS_ROUTES = {"/readyz", "/v2/health/ready"}


def _documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for index, document in enumerate(yaml.safe_load_all(path.read_text())):
            if document is not None:
                name = f"{path.relative_to(DEPLOY)}#{index} {document['kind']}"
                found.append((name, document))
    return found


DOCUMENTS = _documents()
CORE = [(name, doc) for name, doc in DOCUMENTS if (doc["apiVersion"], doc["kind"]) not in CUSTOM]


def _one(kind: str, path: str | None = None) -> dict[str, Any]:
    matches = [
        doc
        for name, doc in DOCUMENTS
        if doc["kind"] == kind and (path is None or name.startswith(path))
    ]
    assert len(matches) == 1, f"expected one {kind} under {path or DEPLOY}, found {len(matches)}"
    return matches[0]


DEPLOYMENTS = {variant: _one("Deployment", f"plain/{variant}/") for variant in ("gpu", "cpu")}
ISVC = _one("InferenceService")


def _isvc_pod_spec() -> dict[str, Any]:
    """The core PodSpec inside the KServe predictor."""
    predictor = ISVC["spec"]["predictor"]
    return {key: value for key, value in predictor.items() if key not in KSERVE_COMPONENT_FIELDS}


#: Every workload's pod spec: (name, pod spec), the GPU and CPU Deployments and KServe's predictor.
PODS = [(f"deployment-{v}", d["spec"]["template"]["spec"]) for v, d in DEPLOYMENTS.items()] + [
    ("inferenceservice", _isvc_pod_spec())
]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    """Name -> value (None for one from a Secret or elsewhere)."""
    return {var["name"]: var.get("value") for var in container.get("env", [])}


def _setting(container: dict[str, Any], name: str) -> Any:
    """The service setting ``name`` as this container runs it: its variable, else the default."""
    value = _env(container).get(f"SMSO_{name.upper()}")
    return Settings.model_fields[name].default if value is None else value


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    assert len(pod["containers"]) == 1, "one container per pod: the service"
    return pod["containers"][0]


def test_every_document_is_known() -> None:
    """A manifest that is neither core Kubernetes nor a custom resource checked here fails, so
    that nothing new goes unvalidated; so does an empty folder."""
    kinds = sorted(doc["kind"] for _, doc in DOCUMENTS)
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "Deployment",
        "HorizontalPodAutoscaler",
        "InferenceService",
        "PersistentVolumeClaim",
        "PodDisruptionBudget",
        "Service",
    ], kinds
    for name, doc in DOCUMENTS:
        group = doc["apiVersion"].split("/")[0]
        assert (
            "." not in group
            or group.endswith(".k8s.io")
            or (doc["apiVersion"], doc["kind"]) in CUSTOM
        ), f"{name}: {doc['apiVersion']} is a custom resource that no test checks"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("name", "document"), CORE, ids=[name for name, _ in CORE])
def test_core_objects_match_the_kubernetes_schema(
    name: str, document: dict[str, Any], version: str
) -> None:
    kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_inferenceservice_pod_spec_matches_the_kubernetes_schema(version: str) -> None:
    """KServe's custom predictor is a PodSpec inline: validated as one, in a Pod."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "smso"},
        "spec": _isvc_pod_spec(),
    }
    kubernetes_validate.validate(pod, version, strict=True)


def test_inferenceservice_is_a_custom_v2_predictor_on_one_gpu() -> None:
    assert ISVC["apiVersion"] == KSERVE
    assert set(ISVC) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(ISVC["spec"]) == {"predictor"}, "a predictor only: no transformer or explainer"
    predictor = ISVC["spec"]["predictor"]
    assert "model" not in predictor, "a custom container, not one of KServe's model formats"
    assert predictor["scaleMetric"] in {"cpu", "memory", "concurrency", "rps"}
    assert predictor["minReplicas"] >= 1, "scale to zero would mean minutes of TensorRT builds"
    assert predictor["minReplicas"] <= predictor["maxReplicas"]
    pod = _isvc_pod_spec()
    assert not KNATIVE_REFUSED_POD & set(pod), "Knative refuses these pod fields"
    container = _container(pod)
    assert container["name"] == "kserve-container", "the name KServe gives its predictor"
    assert not KNATIVE_REFUSED_CONTAINER & set(container), "Knative refuses these fields"
    assert re.fullmatch(r"[\w./-]+:gpu", container["image"]), "the GPU image"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    env = _env(container)
    assert env["PROTOCOL"] == "v2", "KServe reads a custom predictor's protocol from PROTOCOL"
    # pvc://NAME: KServe mounts the claim read-only at /mnt/models
    claim = _one("PersistentVolumeClaim")["metadata"]["name"]
    assert env["STORAGE_URI"] == f"pvc://{claim}"
    assert env["SMSO_MODEL_REPOSITORY"] == "/mnt/models"
    (port,) = container["ports"]  # Knative: exactly one
    assert port["name"] == "http1", "Knative's name for HTTP/1.1 (h2c: HTTP/2), which it speaks"
    annotations = ISVC["metadata"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == str(port["containerPort"])
    assert annotations["prometheus.kserve.io/path"] == "/metrics"


def test_inferenceservice_timeout_covers_the_drain() -> None:
    """Knative's grace period is the revision's timeout: it must cover the service's drain."""
    container = _container(_isvc_pod_spec())
    drain = (
        int(_setting(container, "keep_alive_s"))
        + int(float(_setting(container, "request_timeout_s")))
        + 5
    )
    assert ISVC["spec"]["predictor"]["timeout"] >= drain


@pytest.mark.parametrize(("name", "pod"), PODS, ids=[name for name, _ in PODS])
def test_environment_holds_only_settings_of_the_service(name: str, pod: dict[str, Any]) -> None:
    """Every SMSO_* variable is a field of Settings (a misspelt one would be ignored by nobody:
    Settings forbids unknown fields, so the service would not start), and the values parse."""
    fields = {f"SMSO_{field.upper()}": field for field in Settings.model_fields}
    env = _env(_container(pod))
    allowed_others = KSERVE_VARIABLES if name == "inferenceservice" else set()
    values = {}
    for variable, value in env.items():
        if not variable.startswith("SMSO_"):
            assert variable in allowed_others, f"{name}: {variable} is not a setting"
        elif variable in fields:
            if value is not None and variable not in CLUSTER_PATHS:
                values[fields[variable]] = value
        else:
            raise AssertionError(f"{name}: {variable} is not a field of Settings")
    Settings(model_path=DEFAULT_MODEL, **values)


@pytest.fixture(scope="module")
def get_routes() -> set[str]:
    app = create_app(Settings(model_path=DEFAULT_MODEL))
    return {path for path, item in app.openapi()["paths"].items() if "get" in item}


@pytest.mark.parametrize(("name", "pod"), PODS, ids=[name for name, _ in PODS])
def test_probes_ask_the_health_routes_on_the_service_port(
    name: str, pod: dict[str, Any], get_routes: set[str]
) -> None:
    container = _container(pod)
    port = int(_setting(container, "port"))
    declared = container["ports"][0]  # HTTP first (Knative: the only one); then gRPC's
    assert declared["containerPort"] == port, f"{name}: the container port is not SMSO_PORT"
    for extra in container["ports"][1:]:
        assert extra["containerPort"] == int(_setting(container, "grpc_port")), (
            f"{name}: a second port is not SMSO_GRPC_PORT"
        )
    assert _setting(container, "host") == "0.0.0.0", (
        f"{name}: the service must listen beyond localhost"
    )
    for probe, routes in (("readinessProbe", READINESS_ROUTES), ("livenessProbe", LIVENESS_ROUTES)):
        get = container[probe]["httpGet"]
        assert get["path"] in routes, f"{name}: {probe} asks {get['path']}, not one of {routes}"
        assert get["path"] in get_routes, f"{name}: {get['path']} is not a GET route of the app"
        assert get["port"] in {port, declared.get("name")}, f"{name}: {probe} asks another port"


@pytest.mark.parametrize("variant", DEPLOYMENTS)
def test_deployment_drains_before_it_is_killed(variant: str) -> None:
    """preStop keeps serving while the endpoint goes; then SIGTERM: keep-alive connections get
    SMSO_KEEP_ALIVE_S to close, requests in flight SMSO_REQUEST_TIMEOUT_S + 5 s (uvicorn's
    graceful shutdown, service/cli.py); the grace period must cover all of it."""
    pod = DEPLOYMENTS[variant]["spec"]["template"]["spec"]
    container = _container(pod)
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre_stop >= 5, "endpoints take a few seconds to leave the Service and balancers"
    keep_alive = int(_setting(container, "keep_alive_s"))
    requests = int(float(_setting(container, "request_timeout_s"))) + 5
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + keep_alive + requests


@pytest.mark.parametrize(("name", "pod"), PODS, ids=[name for name, _ in PODS])
def test_pod_runs_as_the_image_user_on_a_read_only_root(name: str, pod: dict[str, Any]) -> None:
    """The image's `USER smso` is a name, which the kubelet cannot check against runAsNonRoot:
    the uid must be given, and be the Dockerfile's. Everything the service writes is a volume."""
    dockerfile = (ROOT / "docker/serve-gpu.Dockerfile").read_text()
    useradd = re.search(r"useradd [^\n]*--uid (\d+)", dockerfile)
    assert useradd is not None, "the Dockerfile creates no user with a fixed --uid"
    uid = int(useradd[1])
    container = _container(pod)
    security = {**pod.get("securityContext", {}), **container["securityContext"]}
    assert security["runAsNonRoot"] is True, name
    assert security["runAsUser"] == uid, name
    assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
    assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert not mounts["/tmp"].get("readOnly"), f"{name}: uploads spool to /tmp"
    cache = _env(container).get("SMSO_ENGINE_CACHE_DIR")
    if cache is not None:
        assert not mounts[cache].get("readOnly"), f"{name}: TensorRT writes its cache there"
    volumes = {v["name"] for v in pod["volumes"]}
    assert {m["name"] for m in mounts.values()} <= volumes, f"{name}: a mount without a volume"


@pytest.mark.parametrize("variant", DEPLOYMENTS)
def test_deployment_mounts_the_model_repository_read_only(variant: str) -> None:
    pod = DEPLOYMENTS[variant]["spec"]["template"]["spec"]
    container = _container(pod)
    repository = _env(container)["SMSO_MODEL_REPOSITORY"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == repository]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    claim = _one("PersistentVolumeClaim")["metadata"]["name"]
    assert volume["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}


def test_gpu_and_cpu_deployments_differ_only_where_they_must() -> None:
    gpu, cpu = (_container(DEPLOYMENTS[v]["spec"]["template"]["spec"]) for v in ("gpu", "cpu"))
    assert gpu["image"].endswith(":gpu")
    assert cpu["image"].endswith(":cpu")
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in cpu["resources"]["requests"] | cpu["resources"]["limits"]
    assert DEPLOYMENTS["gpu"]["metadata"]["name"] == DEPLOYMENTS["cpu"]["metadata"]["name"], (
        "one name: the Service, autoscaler and budget apply to whichever is deployed"
    )
    for key in ("readinessProbe", "livenessProbe", "lifecycle", "ports"):
        assert gpu[key] == cpu[key], key


@pytest.mark.parametrize("variant", DEPLOYMENTS)
def test_service_budget_and_autoscaler_reach_the_deployment(variant: str) -> None:
    deployment = DEPLOYMENTS[variant]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    service = _one("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    container_ports = _container(deployment["spec"]["template"]["spec"])["ports"]
    service_ports = service["spec"]["ports"]
    assert len(service_ports) == len(container_ports)  # HTTP 8000 and gRPC 8001
    for container_port, service_port in zip(container_ports, service_ports, strict=True):
        assert service_port["targetPort"] in {
            container_port["name"],
            container_port["containerPort"],
        }
        assert service_port["port"] == container_port["containerPort"]
    assert [p["containerPort"] for p in container_ports] == [8000, 8001]
    budget = _one("PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = _one("HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2, "with 1, the budget would block every node drain"


def test_autoscaler_metric_is_exported_and_served_by_the_adapter_rule() -> None:
    hpa = _one("HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    assert metric["pods"]["target"]["type"] == "AverageValue"
    exported = {family.name for family in Metrics().registry.collect()}
    assert name in exported, f"{name} is not one of the service's metrics: {sorted(exported)}"
    config = yaml.safe_load(_one("ConfigMap")["data"]["config.yaml"])
    served = {rule["name"]["as"]: rule for rule in config["rules"]}
    assert name in served, "prometheus-adapter's rule does not serve the autoscaler's metric"
    assert served[name]["seriesQuery"].startswith(f"{name}{{")
    assert set(served[name]["resources"]["overrides"]) == {"namespace", "pod"}
    pod = DEPLOYMENTS["gpu"]["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8000"
