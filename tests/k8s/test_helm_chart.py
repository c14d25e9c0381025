"""The Helm chart deploy/helm/kai-es, rendered by the real helm (v3.22.0, built by
tools/k8s/controlplane.py): it lints, renders with default and non-trivial values, every
container's args pass the kai-es CLI's own parser, its RBAC rules and CRDs are exactly the
files in deploy/rbac/ and deploy/crds/, and wrong values stop the render with a clear message.
(tests/k8s/test_helm_install.py applies it to a real apiserver and runs kai-es as its
ServiceAccount.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit
from typing import Any

import click
import msgspec
import pytest

from kai_es.adapters.kafka_log import parse_url
from kai_es.adapters.status_http import parse_bind_address
from kai_es.scenario import load_scenario_text
from kai_es.scheduling.config import SchedulerConfig, parse_config
from tests.k8s.conftest import ROOT
from tests.k8s.helm import (CHART, FULL_VALUES, SHARD_VALUES, by_kind, container, helm, load_yaml, parse_cli_args,
                             render)

ROLES = ("informer", "scheduler", "binder")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def deployments(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in by_kind(objs, "Deployment")}


def scheduler_config_text(objs: list[dict[str, Any]]) -> str:
    (cm,) = by_kind(objs, "ConfigMap")
    return str(cm["data"]["scheduler.yaml"])


@pytest.mark.parametrize("values", [(), (FULL_VALUES,), (SHARD_VALUES,), (FULL_VALUES, SHARD_VALUES)],
                         ids=["default", "full", "shards", "full+shards"])
def test_helm_lint_strict_passes(home: Path, values: tuple[Path, ...]) -> None:
    args = ["lint", "--strict", str(CHART)]
    for v in values:
        args += ["-f", str(v)]
    run = helm(*args, home=home)
    assert "1 chart(s) linted, 0 chart(s) failed" in run.stdout, run.stdout
    assert "[ERROR]" not in run.stdout and "[WARNING]" not in run.stdout, run.stdout


def test_default_values_render_the_three_processes_and_their_rbac(home: Path) -> None:
    objs = render(home)
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted(["Namespace", "ServiceAccount", "ServiceAccount", "ConfigMap", "ClusterRole",
                            "ClusterRoleBinding", "Role", "RoleBinding", "Role", "RoleBinding",
                            "Deployment", "Deployment", "Deployment", "NetworkPolicy"])
    deps = deployments(objs)
    assert set(deps) == set(ROLES)
    ids = set()
    for role, d in deps.items():
        assert d["spec"]["replicas"] == 1
        # a new pod stands by until the old one hands its Lease back
        assert d["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
        c = container(d)
        assert leader_flags(c["args"]) == {"--leader-elect-lease": f"kai-es/kai-es-{role}",
                                           "--leader-elect-lease-duration": "15s",
                                           "--leader-elect-renew-deadline": "10s",
                                           "--leader-elect-retry-period": "2s"}
        assert c["args"][-2:] == ["--http-bind-address", ":8080"]
        assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert c["command"] == ["kai-es"] and c["args"][0] == role
        assert c["image"] == "kai-es:0.1.0"
        url = c["args"][c["args"].index("--log") + 1]
        cfg = parse_url(url)
        assert (cfg.bootstrap, cfg.topic, cfg.create) == ("kafka:9092", "kai-es.events", True)
        ids.add(cfg.transactional_id)
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        # the scheduler's own identity, allowed its Lease only
        assert pod["serviceAccountName"] == ("kai-es-scheduler" if role == "scheduler" else "kai-es")
        assert "automountServiceAccountToken" not in pod
    # one stable transactional id per role, derived from the topic
    assert ids == {f"kai-es-{role}.kai-es.events" for role in ROLES}
    # the scheduler's configuration is kai-es's default
    scenario = load_scenario_text(scheduler_config_text(objs), "configmap")
    assert scenario.config == parse_config({})
    (leader_binding,) = [b for b in by_kind(objs, "RoleBinding") if b["metadata"]["namespace"] == "kai-es"]
    assert {s["name"] for s in leader_binding["subjects"]} == {"kai-es", "kai-es-scheduler"}
    scheduler_bindings = [b for b in [*by_kind(objs, "RoleBinding"), *by_kind(objs, "ClusterRoleBinding")]
                          if "kai-es-scheduler" in {s["name"] for s in b["subjects"]}]
    assert [b["roleRef"]["name"] for b in scheduler_bindings] == ["kai-es-leader-election"]


def leader_flags(args: list[str]) -> dict[str, str]:
    """The --leader-elect-* options with their values (and --leader-elect present)."""
    if "--leader-elect" not in args:
        return {}
    return {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--leader-elect-")}


def test_without_leader_election_one_replica_recreate_and_no_scheduler_identity(home: Path) -> None:
    objs = render(home, sets={"leaderElection.enabled": "false"})
    for role, d in deployments(objs).items():
        assert d["spec"]["strategy"] == {"type": "Recreate"}
        assert not leader_flags(container(d)["args"])
        if role == "scheduler":
            assert d["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert [sa["metadata"]["name"] for sa in by_kind(objs, "ServiceAccount")] == ["kai-es"]
    assert [r["metadata"]["name"] for r in by_kind(objs, "Role")] == ["kai-es-gpu-reservation"]
    run = helm("template", "kai-es", str(CHART), "--set", "leaderElection.enabled=false", "--set",
               "binder.replicas=2", home=home, check=False)
    assert run.returncode != 0 and "more than one replica needs leaderElection.enabled" in run.stderr


def test_full_values_render_every_setting(home: Path) -> None:
    values = load_yaml(FULL_VALUES)
    defaults = load_yaml(CHART / "values.yaml")
    objs = render(home, release="prod", namespace="ml-system", values=[FULL_VALUES])
    assert "Namespace" not in {o["kind"] for o in objs}  # reservation.createNamespace: false
    deps = deployments(objs)
    # metrics: a Service per role selecting that role's pods on the http port, one ServiceMonitor
    services = {s["metadata"]["name"]: s for s in by_kind(objs, "Service")}
    assert sorted(services) == [f"gpu-sched-{r}-metrics" for r in ("binder", "informer", "scheduler")]
    for role, d in deps.items():
        svc = services[f"gpu-sched-{role}-metrics"]
        assert svc["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]
        assert svc["spec"]["ports"] == [{"name": "http", "port": 9102, "targetPort": "http", "protocol": "TCP"}]
        assert svc["metadata"]["annotations"] == {"prometheus.io/port": "9102"}
    (monitor,) = by_kind(objs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    assert all(set(monitor["spec"]["selector"]["matchLabels"].items()) <= set(s["metadata"]["labels"].items())
               for s in services.values())
    sas = by_kind(objs, "ServiceAccount")
    assert [sa["metadata"]["name"] for sa in sas] == ["gpu-sched-sa", "gpu-sched-scheduler-sa"]
    assert all(sa["metadata"]["annotations"] == {"example.com/owner": "ml-platform"} for sa in sas)
    assert deps["binder"]["spec"]["replicas"] == 2
    for role, d in deps.items():
        assert d["metadata"]["name"] == f"gpu-sched-{role}"
        assert d["metadata"]["labels"]["team"] == "ml-platform"
        pod = d["spec"]["template"]["spec"]
        c = container(d)
        assert c["image"] == "registry.example.com/ml-platform/kai-es@" + values["image"]["digest"]
        assert c["imagePullPolicy"] == "Always"
        assert pod["imagePullSecrets"] == [{"name": "registry-example"}]
        assert pod["priorityClassName"] == "system-cluster-critical"
        assert pod["terminationGracePeriodSeconds"] == 20
        assert pod["securityContext"]["runAsUser"] == 20000
        assert d["spec"]["template"]["metadata"]["labels"]["cost-center"] == "ml"
        assert d["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "false"
        assert {"name": "KAI_ES_PACKER", "value": "reference"} in c["env"]
        assert c["resources"] == values[role].get("resources", defaults[role]["resources"])
        assert "--verbose" in c["args"]
        # per-role constraints win over the top-level ones
        assert pod["nodeSelector"] == values[role].get("nodeSelector", values["nodeSelector"])
        assert pod["tolerations"] == values[role].get("tolerations", values["tolerations"])
        assert pod["affinity"] == values["affinity"]
        url = c["args"][c["args"].index("--log") + 1]
        query = {k: v[-1] for k, v in parse_qs(urlsplit(url).query).items()}
        # TLS and SASL: the URL's options, the credentials from the Secret, the CA mounted
        assert (query.pop("security_protocol"), query.pop("sasl_mechanism"), query.pop("ssl_cafile")) == (
            "SASL_SSL", "SCRAM-SHA-512", "/etc/kai-es/kafka-tls/ca.crt")
        assert {"name": "KAI_ES_KAFKA_SASL_PASSWORD",
                "valueFrom": {"secretKeyRef": {"name": "kafka-kai-es-user", "key": "password"}}} in c["env"]
        assert {"name": "kafka-tls", "mountPath": "/etc/kai-es/kafka-tls", "readOnly": True} in c["volumeMounts"]
        assert {"name": "kafka-tls", "secret": {"secretName": "kafka-cluster-ca"}} in pod["volumes"]
        cfg = parse_url(url.split("?")[0] + "?" + "&".join(f"{k}={v}" for k, v in query.items()))
        assert cfg.bootstrap == "kafka-0.kafka.data.svc:9093,kafka-1.kafka.data.svc:9093"
        assert (cfg.topic, cfg.create) == ("prod.kai-es.events", False)
        assert cfg.transactional_id == f"gpu-cluster-7-{role}.prod.kai-es.events"
        assert pod["serviceAccountName"] == ("gpu-sched-scheduler-sa" if role == "scheduler" else "gpu-sched-sa")
        assert leader_flags(c["args"]) == {"--leader-elect-lease": f"ml-system/gpu-sched-{role}",
                                           "--leader-elect-lease-duration": "30s",
                                           "--leader-elect-renew-deadline": "20s",
                                           "--leader-elect-retry-period": "5s"}
        assert d["spec"]["strategy"] == values["updateStrategy"]
        assert c["ports"][0]["containerPort"] == 9102 and c["args"][-2:] == ["--http-bind-address", ":9102"]
        assert c["livenessProbe"] == {"httpGet": {"path": "/healthz", "port": "http"}, **values["http"]["livenessProbe"]}
        assert "readinessProbe" not in c
    b = container(deps["binder"])["args"]
    assert b[b.index("--poll") + 1] == "20ms" and "--scheduled-events" in b
    assert b[b.index("--reservation-image") + 1] == values["binder"]["reservationImage"]
    assert b[b.index("--device-index-wait") + 1] == "30s"
    s = container(deps["scheduler"])["args"]
    assert s[s.index("--period") + 1] == "500ms" and s[s.index("--snapshot-every") + 1] == "20"
    assert s[s.index("--checkpoints") + 1] == "3"
    assert s[s.index("--packer") + 1] == "reference"
    scenario = load_scenario_text(scheduler_config_text(objs), "configmap")
    assert scenario.config == parse_config(values["scheduler"]["config"])
    # the bindings name the ServiceAccounts in the release namespace
    (cluster_binding,) = by_kind(objs, "ClusterRoleBinding")
    assert cluster_binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-sched-sa", "namespace": "ml-system"}]
    subjects = {b["roleRef"]["name"]: b["subjects"] for b in by_kind(objs, "RoleBinding")}
    assert subjects["gpu-sched-gpu-reservation"] == cluster_binding["subjects"]
    assert subjects["gpu-sched-leader-election"] == [
        *cluster_binding["subjects"], {"kind": "ServiceAccount", "name": "gpu-sched-scheduler-sa", "namespace": "ml-system"}]


def test_http_disabled_means_no_flag_no_port_no_probe(home: Path) -> None:
    for d in deployments(render(home, sets={"http.enabled": "false"})).values():
        c = container(d)
        assert "--http-bind-address" not in c["args"]
        assert not {"ports", "livenessProbe", "readinessProbe"} & set(c)


def test_config_change_rolls_only_the_scheduler(home: Path) -> None:
    a = deployments(render(home))
    b = deployments(render(home, sets={"scheduler.config.placementStrategy.gpu": "spread"}))
    assert a["scheduler"]["spec"]["template"] != b["scheduler"]["spec"]["template"]
    assert a["binder"] == b["binder"] and a["informer"] == b["informer"]


@pytest.mark.parametrize("values", [(), (FULL_VALUES,), (SHARD_VALUES,), (FULL_VALUES, SHARD_VALUES)],
                         ids=["default", "full", "shards", "full+shards"])
def test_every_container_args_pass_the_kai_es_cli_parser(home: Path, tmp_path: Path,
                                                        values: tuple[Path, ...]) -> None:
    objs = render(home, values=values)
    # --scenario names the mounted file of the pod's ConfigMap: check it against a copy
    for cm in by_kind(objs, "ConfigMap"):
        (tmp_path / cm["metadata"]["name"]).write_text(cm["data"]["scheduler.yaml"])
    for d in by_kind(objs, "Deployment"):
        role = d["metadata"]["labels"]["app.kubernetes.io/component"]
        c = container(d)
        (config,) = [v["configMap"]["name"] for v in d["spec"]["template"]["spec"]["volumes"] if "configMap" in v] or [""]
        args = [str(tmp_path / config) if a == "/etc/kai-es/scheduler.yaml" else a for a in c["args"]]
        ctx = parse_cli_args(args)
        assert ctx.command.name == role
        # the address the process serves its probes on (checked when it starts) is the port
        # the probes name
        host, port = parse_bind_address(ctx.params["http_address"])
        assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("http", port)]
        assert host == "0.0.0.0"
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        if role == "scheduler":
            assert "/etc/kai-es" in mounts and "/etc/kai-es/scheduler.yaml" in c["args"]
        # the parser really checks: a flag the CLI does not have, or a bad value, is refused
        with pytest.raises(click.UsageError, match="no-such-flag"):
            parse_cli_args([*args, "--no-such-flag"])
    with pytest.raises(click.BadParameter):
        parse_cli_args(["scheduler", "--log", "x", "--snapshot-every", "often"])


def test_rbac_and_crds_are_the_files_in_deploy(home: Path) -> None:
    # deploy/rbac and deploy/crds are the chart's own files (one copy)
    for link, target in (("rbac", CHART / "files" / "rbac"), ("crds", CHART / "crds")):
        path = ROOT / "deploy" / link
        assert path.is_symlink() and path.resolve() == target.resolve(), path
    objs = render(home, include_crds=True)
    cluster_file = load_yaml(ROOT / "deploy" / "rbac" / "clusterrole.yaml")
    reservation_file = load_yaml(ROOT / "deploy" / "rbac" / "reservation-role.yaml")
    leader_file = load_yaml(ROOT / "deploy" / "rbac" / "leader-election-role.yaml")
    (cluster_role,) = by_kind(objs, "ClusterRole")
    roles = {r["metadata"]["name"]: r for r in by_kind(objs, "Role")}
    assert cluster_role["rules"] == cluster_file["rules"]
    assert roles["kai-es-gpu-reservation"]["rules"] == reservation_file["rules"]
    assert roles["kai-es-gpu-reservation"]["metadata"]["namespace"] == reservation_file["metadata"]["namespace"]
    assert roles["kai-es-leader-election"]["rules"] == leader_file["rules"]
    assert roles["kai-es-leader-election"]["metadata"]["namespace"] == "kai-es"  # the release's
    (ns,) = by_kind(objs, "Namespace")
    assert ns["metadata"]["name"] == reservation_file["metadata"]["namespace"]
    crds = sorted(by_kind(objs, "CustomResourceDefinition"), key=lambda o: o["metadata"]["name"])
    files = sorted((load_yaml(p) for p in (ROOT / "deploy" / "crds").glob("*.yaml")),
                   key=lambda o: o["metadata"]["name"])
    assert crds == files and len(files) == 3
    # the CRDs live only in crds/, which `helm install --skip-crds` leaves out (KAI's own CRDs
    # already installed): no template renders one
    assert not by_kind(render(home), "CustomResourceDefinition")


@pytest.mark.parametrize(("sets", "message"), [
    # values.schema.json
    ({"eventLog.url": "/var/log/kai-es.jsonl"}, "at '/eventLog/url'"),
    ({"eventLg.url": "kafka://k:9092/t"}, "additional properties 'eventLg' not allowed"),
    ({"scheduler.config.placementStrategy.gpu": "tightly"}, "at '/scheduler/config/placementStrategy/gpu'"),
    ({"scheduler.config.actons": "allocate"}, "additional properties 'actons' not allowed"),
    ({"http.port": "0"}, "at '/http/port'"),
    # the templates
    ({"eventLog.url": "kafka://k:9092/t?transactional_id=x"}, "must not carry ?transactional_id="),
    ({"serviceAccount.create": "false", "leaderElection.enabled": "false"}, "serviceAccount.name: the existing"),
    ({"serviceAccount.create": "false", "serviceAccount.name": "x"}, "serviceAccount.schedulerName: the existing"),
    ({"http.enabled": "false", "metrics.serviceMonitor.enabled": "true"}, "need http.enabled"),
    ({"metrics.serviceMonitor.interval": "often"}, "at '/metrics/serviceMonitor/interval'"),
    ({"eventLog.file.path": "events.jsonl"}, "at '/eventLog/file/path'"),
    ({"eventLog.file.path": "/var/lib/kai-es/events.jsonl"}, "eventLog.file.path needs eventLog.file.volume"),
])
def test_wrong_values_stop_the_render_with_a_message(home: Path, sets: dict[str, str], message: str) -> None:
    args = ["template", "kai-es", str(CHART)]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    run = helm(*args, home=home, check=False)
    assert run.returncode != 0 and message in run.stderr, run.stderr


def test_the_templates_refuse_a_non_kafka_log_even_without_the_schema(home: Path) -> None:
    run = helm("template", "kai-es", str(CHART), "--skip-schema-validation", "--set",
               "eventLog.url=/var/log/kai-es.jsonl", home=home, check=False)
    assert run.returncode != 0 and "expected kafka://host:port/topic" in run.stderr, run.stderr


def test_the_file_log_is_one_volume_every_role_mounts(home: Path) -> None:
    """eventLog.file: each role's --log is the path, in the directory where the volume is
    mounted; no Kafka URL or transactional id is left in the args."""
    objs = render(home, sets={"eventLog.file.path": "/var/lib/kai-es/events.jsonl",
                              "eventLog.file.volume.hostPath.path": "/srv/kai-es",
                              "eventLog.file.volume.hostPath.type": "Directory"})
    for role, deploy in deployments(objs).items():
        c, pod = container(deploy), deploy["spec"]["template"]["spec"]
        assert c["args"][c["args"].index("--log") + 1] == "/var/lib/kai-es/events.jsonl", role
        assert not any("kafka://" in a for a in c["args"]), c["args"]
        assert {"name": "event-log", "mountPath": "/var/lib/kai-es"} in c["volumeMounts"]
        assert {"name": "event-log", "hostPath": {"path": "/srv/kai-es", "type": "Directory"}} in pod["volumes"]
        parse_cli_args(c["args"])


def test_values_schema_config_part_is_generated_from_kai_es() -> None:
    """values.schema.json's scheduler.config is SchedulerConfig's own schema (so helm refuses
    what the scheduler would refuse by key or type), and the file is current."""
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_chart_schema.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    schema = json.loads((CHART / "values.schema.json").read_text())
    config = schema["properties"]["scheduler"]["properties"]["config"]
    assert set(config["properties"]) == {f.encode_name for f in msgspec.structs.fields(SchedulerConfig)}
    assert config["additionalProperties"] is False


def test_dockerfile_matches_what_the_chart_runs() -> None:
    """deploy/Dockerfile (not built here: no Docker daemon) installs the `kai-es` script the
    containers run, as the uid/gid the chart's podSecurityContext names."""
    import tomllib

    text = (ROOT / "deploy" / "Dockerfile").read_text()
    values = load_yaml(CHART / "values.yaml")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "kai-es" in scripts
    ctx = values["podSecurityContext"]
    assert f"USER {ctx['runAsUser']}:{ctx['runAsGroup']}" in text
    assert 'ENTRYPOINT ["kai-es"]' in text and "FROM python:3.11-slim" in text
    assert "import kai_es._native._packer, kai_es._native._framing" in text


def test_grouping_rules_reach_the_informer_and_grow_its_rbac_by_get(home: Path, tmp_path: Path) -> None:
    """`scheduler.config.grouping` (no-code rules): the informer reads them from the config
    file it mounts (`--scenario`), rolls when they change (not when the rest does), and the
    ClusterRole gains `get` on each rule's kind, nothing else."""
    from tests.workloads import NOCODE_RULES  # noqa: PLC0415

    values = tmp_path / "rules.yaml"
    values.write_text(json.dumps({"scheduler": {"config": {"grouping": NOCODE_RULES}}}))
    plain, ruled = render(home), render(home, values=[values])
    (cluster_role,) = by_kind(ruled, "ClusterRole")
    (before,) = by_kind(plain, "ClusterRole")
    added = cluster_role["rules"][len(before["rules"]):]
    assert cluster_role["rules"][:len(before["rules"])] == before["rules"]
    assert added == [{"apiGroups": [r["group"]], "resources": [r["plural"]], "verbs": ["get"]} for r in NOCODE_RULES]
    informer = container(deployments(ruled)["informer"])
    args = informer["args"]
    assert args[args.index("--scenario") + 1] == "/etc/kai-es/scheduler.yaml"
    assert {m["mountPath"] for m in informer["volumeMounts"]} >= {"/etc/kai-es"}
    scenario = load_scenario_text(scheduler_config_text(ruled), "configmap")
    assert scenario.config.grouping == parse_config({"grouping": NOCODE_RULES}).grouping
    a, b = deployments(plain), deployments(ruled)
    assert a["informer"]["spec"]["template"] != b["informer"]["spec"]["template"]  # rolls with its rules
    assert a["binder"] == b["binder"]


def test_roles_with_standbys_get_a_disruption_budget_over_their_own_pods(home: Path) -> None:
    """Only a role of more than one replica: a node drain takes one pod of the pair at a time."""
    objs = render(home, sets={"scheduler.replicas": "2", "informer.replicas": "3"})
    deps = deployments(objs)
    budgets = {b["metadata"]["labels"]["app.kubernetes.io/component"]: b for b in by_kind(objs, "PodDisruptionBudget")}
    assert sorted(budgets) == ["informer", "scheduler"]
    for role, pdb in budgets.items():
        assert pdb["spec"] == {"maxUnavailable": 1, "selector": deps[role]["spec"]["selector"]}
        assert pdb["apiVersion"] == "policy/v1"
    assert not by_kind(render(home, sets={"scheduler.replicas": "2", "podDisruptionBudget.enabled": "false"}),
                       "PodDisruptionBudget")
    assert not by_kind(render(home), "PodDisruptionBudget")  # one replica each: none


def test_the_network_policy_admits_the_http_port_only(home: Path) -> None:
    (policy,) = by_kind(render(home), "NetworkPolicy")
    deps = deployments(render(home))
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= deps["scheduler"]["spec"]["selector"]["matchLabels"].items()
    assert all(policy["spec"]["podSelector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
               for d in deps.values())
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]
    (full,) = by_kind(render(home, values=[FULL_VALUES]), "NetworkPolicy")
    assert full["spec"]["ingress"][0]["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]
    (closed,) = by_kind(render(home, sets={"http.enabled": "false"}), "NetworkPolicy")
    assert closed["spec"]["ingress"] == []  # nothing listens: nothing admitted
    assert not by_kind(render(home, sets={"networkPolicy.enabled": "false"}), "NetworkPolicy")


# -- scheduling shards ---------------------------------------------------------------------------

def shard_of(obj: dict[str, Any]) -> str | None:
    shard = obj["metadata"]["labels"].get("kai-es.io/shard")
    return None if shard is None else str(shard)


def by_name(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in by_kind(objs, kind)}


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_shards_get_a_scheduler_and_a_binder_each_on_their_own_log_lease_and_config(home: Path) -> None:
    """ci/shards-values.yaml: shards default ("", the unlabelled objects) and gpu (gpu-nodes).
    Each gets <fullname>-scheduler-<shard> and <fullname>-binder-<shard>, on the same base --log
    URL as today plus --shard, from which the kai-es CLI itself derives a log and writer ids of
    the shard's own; a Lease of its own; the scheduler a ConfigMap of its own (the shard's config
    merged over scheduler.config); the one informer every --shard NAME=VALUE."""
    from kai_es.app.processes import BINDER_TXN_ID, SCHEDULER_TXN_ID  # noqa: PLC0415
    from kai_es.cli_services import _shard_log  # noqa: PLC0415
    from kai_es.ingest.shards import ShardMap, shard_log_url, shard_writer  # noqa: PLC0415

    values = load_yaml(SHARD_VALUES)
    objs = render(home, values=[SHARD_VALUES])
    deps = by_name(objs, "Deployment")
    assert sorted(deps) == ["kai-es-binder-default", "kai-es-binder-gpu", "kai-es-informer",
                            "kai-es-scheduler-default", "kai-es-scheduler-gpu"]
    informer = container(deps.pop("kai-es-informer"))["args"]
    assert [a for i, a in enumerate(informer) if informer[i - 1] == "--shard"] == ["default=", "gpu=gpu-nodes"]
    shards = ShardMap.parse([a for i, a in enumerate(informer) if informer[i - 1] == "--shard"])
    assert [(s.name, s.value) for s in shards.shards] == [("default", ""), ("gpu", "gpu-nodes")]
    base = flag(informer, "--log")
    logs, writers, leases, selectors = set(), set(), set(), []
    for name, d in deps.items():
        role, shard = d["metadata"]["labels"]["app.kubernetes.io/component"], shard_of(d)
        assert shard is not None and name == f"kai-es-{role}-{shard}"
        # the shard's label on the Deployment, its selector and its pods
        assert d["spec"]["selector"]["matchLabels"] == {
            "app.kubernetes.io/name": "kai-es", "app.kubernetes.io/instance": "kai-es",
            "app.kubernetes.io/component": role, "kai-es.io/shard": shard}
        assert d["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        selectors.append(d["spec"]["selector"]["matchLabels"])
        args = container(d)["args"]
        assert args[:5] == [role, "--log", flag(args, "--log"), "--shard", shard]
        url = flag(args, "--log")
        # the chart's own per-role URL (its transactional_id), the same for every shard...
        assert url == base.replace("kai-es-informer.", f"kai-es-{role}.")
        assert parse_url(url).transactional_id == f"kai-es-{role}.kai-es.events"
        # ... from which the CLI derives the shard's log and writer id
        shard_url, writer = _shard_log(url, shard, SCHEDULER_TXN_ID if role == "scheduler" else BINDER_TXN_ID)
        assert shard_url == shard_log_url(url, shard)
        cfg = parse_url(shard_url)
        topic = "kai-es.events" if shard == "default" else f"kai-es.events.{shard}"
        assert cfg.topic == topic
        assert cfg.transactional_id == shard_writer(f"kai-es-{role}.kai-es.events", shard)
        assert parse_url(shard_log_url(base, shard)).topic == topic  # where the informer writes it
        logs.add((role, cfg.topic))
        writers.add(cfg.transactional_id)
        lease = leader_flags(args)["--leader-elect-lease"]
        assert lease == f"kai-es/{name}"
        leases.add(lease)
        # scheduler.replicas: 2 for both; binder.replicas 1, but gpu's binder has its own 2
        assert d["spec"]["replicas"] == (1 if name == "kai-es-binder-default" else 2)
    assert len(logs) == 4 and len(writers) == 4 and len(leases) == 4
    assert {t for _, t in logs} == {"kai-es.events", "kai-es.events.gpu"}
    # no Deployment selects another's pods
    for i, a in enumerate(selectors):
        for b in selectors[i + 1:]:
            assert not (a.items() <= b.items() or b.items() <= a.items())
    # per-shard resources over the role's
    assert container(deps["kai-es-scheduler-gpu"])["resources"] == values["shards"][1]["scheduler"]["resources"]
    assert container(deps["kai-es-scheduler-default"])["resources"] == load_yaml(CHART / "values.yaml")["scheduler"]["resources"]
    # each scheduler mounts its own ConfigMap: the shard's config merged over scheduler.config
    cms = by_name(objs, "ConfigMap")
    assert sorted(cms) == ["kai-es-scheduler", "kai-es-scheduler-default", "kai-es-scheduler-gpu"]
    for shard in ("default", "gpu"):
        pod = deps[f"kai-es-scheduler-{shard}"]["spec"]["template"]["spec"]
        assert {"name": "config", "configMap": {"name": f"kai-es-scheduler-{shard}"}} in pod["volumes"]
        assert shard_of(cms[f"kai-es-scheduler-{shard}"]) == shard
    config = {n: load_scenario_text(cm["data"]["scheduler.yaml"], n).config for n, cm in cms.items()}
    assert config["kai-es-scheduler-default"] == config["kai-es-scheduler"] == parse_config(values["scheduler"]["config"])
    assert config["kai-es-scheduler-gpu"] == parse_config({
        "actions": ["allocate", "reclaim", "preempt"],
        "placementStrategy": {"gpu": "spread", "cpu": "binpack"},
        "minRuntime": {"preemptMinRuntime": "10m"}, "queueDepthPerAction": {"allocate": 25, "reclaim": 8}})
    # the informer keeps the base ConfigMap (grouping rules, schedulerName: one for all shards)
    inf_pod = by_name(objs, "Deployment")["kai-es-informer"]["spec"]["template"]["spec"]
    assert {"name": "config", "configMap": {"name": "kai-es-scheduler"}} in inf_pod["volumes"]
    # a disruption budget per Deployment with standbys: both schedulers (scheduler.replicas: 2)
    # and gpu's binder (its own replicas: 2), each over its own pods only
    budgets = by_name(objs, "PodDisruptionBudget")
    assert sorted(budgets) == ["kai-es-binder-gpu", "kai-es-scheduler-default", "kai-es-scheduler-gpu"]
    for name, pdb in budgets.items():
        assert pdb["spec"] == {"maxUnavailable": 1, "selector": deps[name]["spec"]["selector"]}
    # the NetworkPolicy still covers every pod
    (policy,) = by_kind(objs, "NetworkPolicy")
    assert all(policy["spec"]["podSelector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
               for d in by_kind(objs, "Deployment"))


def test_shards_metrics_a_service_per_deployment_and_the_monitor_labels_targets_by_shard(home: Path) -> None:
    objs = render(home, values=[SHARD_VALUES], sets={"metrics.serviceMonitor.enabled": "true"})
    services = by_name(objs, "Service")
    deps = by_name(objs, "Deployment")
    assert sorted(services) == sorted(f"{d}-metrics" for d in deps)
    for name, svc in services.items():
        d = deps[name.removesuffix("-metrics")]
        assert svc["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]
        assert shard_of(svc) == shard_of(d)
    (monitor,) = by_kind(objs, "ServiceMonitor")
    assert all(monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
               for s in services.values())
    assert monitor["spec"]["targetLabels"] == ["kai-es.io/shard"]
    (plain,) = by_kind(render(home, sets={"metrics.serviceMonitor.enabled": "true"}), "ServiceMonitor")
    assert "targetLabels" not in plain["spec"]


def test_shards_with_the_file_log_live_beside_it_on_the_one_volume(home: Path) -> None:
    from kai_es.ingest.shards import shard_log_url  # noqa: PLC0415

    objs = render(home, values=[SHARD_VALUES], sets={"eventLog.file.path": "/var/lib/kai-es/events.jsonl",
                                                     "eventLog.file.volume.hostPath.path": "/srv/kai-es"})
    for d in by_kind(objs, "Deployment"):
        c, pod = container(d), d["spec"]["template"]["spec"]
        assert flag(c["args"], "--log") == "/var/lib/kai-es/events.jsonl"
        assert {"name": "event-log", "mountPath": "/var/lib/kai-es"} in c["volumeMounts"]
        assert {"name": "event-log", "hostPath": {"path": "/srv/kai-es"}} in pod["volumes"]
        parse_cli_args(c["args"])
        if (shard := shard_of(d)) is not None:
            assert flag(c["args"], "--shard") == shard
    assert shard_log_url("/var/lib/kai-es/events.jsonl", "gpu") == "/var/lib/kai-es/events.gpu.jsonl"
    assert shard_log_url("/var/lib/kai-es/events.jsonl", "default") == "/var/lib/kai-es/events.jsonl"


def test_a_shards_config_change_rolls_only_its_scheduler(home: Path) -> None:
    a = by_name(render(home, values=[SHARD_VALUES]), "Deployment")
    b = by_name(render(home, values=[SHARD_VALUES], sets={"shards[1].config.placementStrategy.cpu": "spread"}),
                "Deployment")
    assert sorted(n for n in a if a[n] != b[n]) == ["kai-es-scheduler-gpu"]
    c = by_name(render(home, values=[SHARD_VALUES], sets={"scheduler.config.placementStrategy.cpu": "spread"}),
                "Deployment")
    assert sorted(n for n in a if a[n] != c[n]) == ["kai-es-scheduler-default", "kai-es-scheduler-gpu"]


def test_no_shards_render_what_the_chart_renders_without_the_key(home: Path, tmp_path: Path) -> None:
    """`shards: []` (the default) is the chart as it was before shards: the same bytes as a copy
    of the chart whose values.yaml has no `shards` key, for the default and the full values."""
    import shutil  # noqa: PLC0415

    bare = tmp_path / "kai-es"
    shutil.copytree(CHART, bare)
    text = (bare / "values.yaml").read_text()
    assert "\nshards: []\n" in text
    (bare / "values.yaml").write_text(text.replace("\nshards: []\n", "\n"))
    empty = tmp_path / "empty.yaml"
    empty.write_text("shards: []\n")
    for values in ([], ["-f", str(FULL_VALUES)], ["--set", "metrics.serviceMonitor.enabled=true,binder.replicas=2"]):
        ours = helm("template", "kai-es", str(CHART), *values, home=home).stdout
        assert helm("template", "kai-es", str(bare), *values, home=home).stdout == ours
        assert helm("template", "kai-es", str(CHART), *values, "-f", str(empty), home=home).stdout == ours
        assert "kai-es.io/shard" not in ours and "--shard" not in ours


@pytest.mark.parametrize(("sets", "message"), [
    # values.schema.json
    ({"shards[0].name": "GPU_pool", "shards[0].partitionLabelValue": "x"}, "at '/shards/0/name'"),
    ({"shards[0].name": "a"}, "missing property 'partitionLabelValue'"),
    ({"shards[0].name": "a", "shards[0].partitionLabelValue": "not a value"}, "at '/shards/0/partitionLabelValue'"),
    ({"shards[0].name": "a", "shards[0].partitionLabelValue": "x", "shards[0].config.placementStrategy.gpu": "tightly"},
     "at '/shards/0/config/placementStrategy/gpu'"),
    ({"shards[0].name": "a", "shards[0].partitionLabelValue": "x", "shards[0].binder.replicas": "0"},
     "at '/shards/0/binder/replicas'"),
    # the templates
    ({"shards[0].name": "a", "shards[0].partitionLabelValue": "x", "shards[1].name": "a",
      "shards[1].partitionLabelValue": "y"}, 'two shards are named "a" (shards[0] and shards[1])'),
    ({"shards[0].name": "a", "shards[0].partitionLabelValue": "x", "shards[1].name": "b",
      "shards[1].partitionLabelValue": "x"}, 'shards "a" and "b" both own partitionLabelValue "x"'),
    ({"shards[0].name": "a", "shards[0].partitionLabelValue": "", "shards[1].name": "b",
      "shards[1].partitionLabelValue": ""}, 'shards "a" and "b" both own partitionLabelValue ""'),
    ({"shards[0].name": "a", "shards[0].partitionLabelValue": "x", "shards[0].config.schedulerName": "kai-es"},
     'shard "a": config.schedulerName is read by the one informer'),
    ({"shards[0].name": "a", "shards[0].partitionLabelValue": "x", "shards[0].scheduler.replicas": "2",
      "leaderElection.enabled": "false"}, 'shard "a": scheduler.replicas is 2: more than one replica needs'),
    ({"shards[0].name": "a" * 50, "shards[0].partitionLabelValue": "x", "metrics.service.enabled": "true"},
     f'shard "{"a" * 50}": its metrics Service kai-es-scheduler-{"a" * 50}-metrics would be longer than 63'),
])
def test_wrong_shards_stop_the_render_naming_the_shard(home: Path, sets: dict[str, str], message: str) -> None:
    args = ["template", "kai-es", str(CHART)]
    for k, v in sets.items():
        args += ["--set-string" if k.endswith(("partitionLabelValue", "name")) else "--set", f"{k}={v}"]
    run = helm(*args, home=home, check=False)
    assert run.returncode != 0 and message in run.stderr, run.stderr


def test_the_templates_check_shard_names_and_values_even_without_the_schema(home: Path) -> None:
    for sets, message in (("shards[0].name=GPU_pool,shards[0].partitionLabelValue=x",
                           'shards[0]: name "GPU_pool" is not a DNS label'),
                          ("shards[0].name=a,shards[0].partitionLabelValue=-x",
                           'shard "a": partitionLabelValue "-x" is not a label value'),
                          ("shards[0].name=a", 'shard "a": partitionLabelValue is required')):
        run = helm("template", "kai-es", str(CHART), "--skip-schema-validation", "--set", sets, home=home, check=False)
        assert run.returncode != 0 and message in run.stderr, run.stderr
