"""deploy/kubernetes/*.yaml against the project.

Every manifest is loaded with PyYAML; then: the kinds and API versions, the
labels that tie the Service, the PodDisruptionBudget and KEDA to the
Deployment's pods, the container's command line parsed by the real ``htmqc``
parser and resolved with the container's environment and the ConfigMap's
TOML as ``htmqc run`` would (a renamed flag or a refused value breaks this),
the probe paths answered by htmqc's real observability server on the port the
resolved options serve, the grace period above ``--shutdown-seconds``, the
pod name as ``--member-id``, the security context against the Dockerfile's
USER, and the KEDA trigger's group, topic and bootstrap servers against the
Deployment's.

Validating against the Kubernetes JSON schemas (kubeconform) needs schemas
that are downloaded from GitHub, which this machine cannot reach; see README
"Deploying".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from htmqc.kafka_defaults import CONSUMER_BASE, consumer_config, is_local
from htmqc.runtime.handlers import check_handler
from htmqc.runtime.launch import load_handler
from htmqc.runtime.options import AT_LEAST_ONCE, RunOptions
from htmqc.sinks.urls import parse_sink_url
from tests.deploy.dockerfile import read_stages
from tests.deploy.support import (
    DEPLOY,
    StubHealth,
    observe_server,
    option_default,
    parse_command,
    run_options,
    status_of,
)
from tests.services import missing

MANIFESTS = DEPLOY / "kubernetes"
#: (apiVersion, kind) of each manifest the directory must hold, once each.
KINDS = {
    ("v1", "ConfigMap"),
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("policy/v1", "PodDisruptionBudget"),
    ("keda.sh/v1alpha1", "ScaledObject"),
}
#: What the downward API gives ``metadata.name`` in this test: a Deployment pod's name.
POD_NAME = "htmqc-transform-7d4b9c6f5-x2k8p"


def _load() -> dict[str, dict[str, Any]]:
    try:
        import yaml
    except ImportError:
        missing("PyYAML is not installed", "make setup installs the dev extras")
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            key = (doc.get("apiVersion"), doc.get("kind"))
            assert key in KINDS, f"{path.name}: unexpected {key}"
            assert doc["kind"] not in docs, f"{path.name}: a second {doc['kind']}"
            assert doc.get("metadata", {}).get("name"), f"{path.name}: no metadata.name"
            docs[doc["kind"]] = doc
    assert {(d["apiVersion"], k) for k, d in docs.items()} == KINDS
    return docs


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    """Kind -> the manifest of that kind."""
    return _load()


def _container(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def _environment(container: dict[str, Any]) -> dict[str, str]:
    """The container's ``env`` as the pod would see it (the downward API's
    ``metadata.name`` is :data:`POD_NAME`)."""
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            assert field == "metadata.name", f"{item['name']}: unexpected {field}"
            env[item["name"]] = POD_NAME
    return env


def _expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in a container's args."""
    for name, val in env.items():
        arg = arg.replace(f"$({name})", val)
    assert "$(" not in arg, f"{arg}: a variable the container does not define"
    return arg


@pytest.fixture(scope="module")
def options(manifests: dict[str, dict[str, Any]], tmp_path_factory: Any) -> RunOptions:
    """The container's ``htmqc run`` options: its args through the real parser and
    option checks, with its environment and the ConfigMap mounted where the
    Deployment mounts it (rewritten to a scratch folder)."""
    container = _container(manifests)
    env = _environment(container)
    args = [_expand(a, env) for a in container["args"]]
    config = parse_command(args).config
    assert config, "the container reads its ConfigMap through --config"
    folder = Path(tmp_path_factory.mktemp("configmap"))
    for name, text in _mounted_config(manifests, config).items():
        (folder / name).write_text(text)
    args = [a.replace(str(Path(config).parent), str(folder)) for a in args]
    return run_options(args, env)


def _mounted_config(docs: dict[str, dict[str, Any]], config: str) -> dict[str, str]:
    """The ConfigMap's files, checked to be mounted at ``config``'s folder."""
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    folder = str(Path(config).parent)
    (mount,) = [m for m in _container(docs)["volumeMounts"] if m["mountPath"] == folder]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    data: dict[str, str] = docs["ConfigMap"]["data"]
    assert Path(config).name in data, f"the ConfigMap has no {Path(config).name}"
    return data


def test_labels_tie_everything_to_the_pods(manifests: dict[str, dict[str, Any]]) -> None:
    """The Deployment's selector picks its pods; the Service, the PDB and KEDA point
    at them."""
    deployment = manifests["Deployment"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert manifests["Service"]["spec"]["selector"] == selector
    assert manifests["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == selector
    target = manifests["ScaledObject"]["spec"]["scaleTargetRef"]
    assert target["name"] == deployment["metadata"]["name"]
    assert target.get("kind", "Deployment") == "Deployment"


def test_args_are_a_valid_htmqc_run(
    manifests: dict[str, dict[str, Any]], options: RunOptions
) -> None:
    """The command line is ``htmqc run`` (the image's ENTRYPOINT) with a handler that
    fits the mode, and the pod's name becomes the member id: the consumer's
    ``group.instance.id`` (static membership)."""
    container = _container(manifests)
    assert "command" not in container, "keep the image's ENTRYPOINT (htmqc)"
    assert read_stages()[-1].exec_form("ENTRYPOINT") == ["htmqc"]
    assert container["args"][0] == "run"
    check_handler(load_handler(container["args"][1]), options.mode)
    assert options.member_id == POD_NAME
    config = consumer_config(options.bootstrap, options.group, options.kafka_config)
    assert not is_local(options.bootstrap), "a cluster's brokers are not on loopback"
    assert int(config["session.timeout.ms"]) >= 10_000, "production session timeout"


def test_probes_are_htmqc_routes(manifests: dict[str, dict[str, Any]], options: RunOptions) -> None:
    """Liveness asks /healthz and readiness /readyz, on the container port that the
    resolved options serve on every interface; htmqc's real server answers both
    paths, and the liveness path fails when the process is stuck."""
    container = _container(manifests)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probes = {}
    for kind in ("livenessProbe", "readinessProbe"):
        get = container[kind]["httpGet"]
        port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
        assert port == options.metrics_port, (kind, port, options.metrics_port)
        probes[kind] = get["path"]
    assert probes == {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    assert options.metrics_host in ("0.0.0.0", "::"), "the kubelet probes the pod's address"
    with observe_server(StubHealth()) as server:
        for path in probes.values():
            assert status_of(server.url + path) == 200, path
    with observe_server(StubHealth(alive=False, is_ready=False)) as server:
        for path in probes.values():
            assert status_of(server.url + path) == 503, path
    service_port = manifests["Service"]["spec"]["ports"][0]["targetPort"]
    assert ports.get(service_port, service_port) == options.metrics_port


def test_grace_period_covers_the_shutdown(
    manifests: dict[str, dict[str, Any]], options: RunOptions
) -> None:
    """SIGKILL comes terminationGracePeriodSeconds after SIGTERM: above the default
    and the configured --shutdown-seconds, twice over (running handlers, then the
    open transaction's commit, each bounded by it)."""
    grace = manifests["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    default = float(option_default("shutdown_seconds"))
    assert grace >= 2 * max(default, options.shutdown_seconds), (grace, options.shutdown_seconds)


def test_security_context_and_resources(manifests: dict[str, dict[str, Any]]) -> None:
    """Non-root (the Dockerfile's uid), read-only root filesystem, no privilege
    escalation, no capabilities; requests and limits for CPU and memory."""
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    container = _container(manifests)
    security = container["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    uid = read_stages()[-1].one("USER").split(":")[0]
    assert str(pod["securityContext"]["runAsUser"]) == uid
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= container["resources"][kind].keys(), kind


def test_keda_scales_on_this_groups_lag(
    manifests: dict[str, dict[str, Any]], options: RunOptions
) -> None:
    """The kafka trigger watches the Deployment's group, topic and brokers, resets as
    htmqc does, and the group's offsets are in Kafka for it to read (at-least-once,
    or a kafka: sink; an exactly-once SQL sink keeps them in the database)."""
    (trigger,) = manifests["ScaledObject"]["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    meta = trigger["metadata"]
    assert meta["consumerGroup"] == options.group
    assert meta["topic"] == options.topic
    assert meta["bootstrapServers"] == options.bootstrap
    assert meta["offsetResetPolicy"] == CONSUMER_BASE["auto.offset.reset"]
    sink_kind = parse_sink_url(options.sink).kind if options.sink else None
    assert options.mode == AT_LEAST_ONCE or sink_kind == "kafka", (options.mode, sink_kind)
    spec = manifests["ScaledObject"]["spec"]
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]


def test_pod_disruption_budget(manifests: dict[str, dict[str, Any]]) -> None:
    """Voluntary evictions take at most one consumer at a time."""
    assert manifests["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
