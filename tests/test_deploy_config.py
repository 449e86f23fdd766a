"""The Kubernetes deployment on paper (docs/deploy.md, deploy/helm/values.yaml, deploy/dagster-k8s.yaml),
validated offline with Dagster's and dagster-k8s's own config code: the instance schema and its
concurrency rules (`dagster_instance_config`), each configurable class's schema (run coordinator, run
launcher, PostgreSQL storage), the k8s_job_executor schema, and dagster-k8s's builder of the step
Kubernetes Job. The pools and the run tag limit are held equal to what mtrag needs of its instance
(mtrag_assets/runner.py INSTANCE_YAML, checked by mtrag_resources/core/instance_file.py), and every
environment variable the files set to what mtrag_resources/core/config.py declares.

Not validated here: the Helm chart itself (its templates and values.schema.json are not in any PyPI
package; `chart_instance` below transcribes the chart templates that turn values into dagster.yaml),
and anything that needs a cluster."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from dagster._config import process_config
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.instance.config import dagster_instance_config
from dagster._serdes.config_class import class_from_code_pointer
from dagster_k8s import k8s_job_executor
from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job
from dagster_postgres import DagsterPostgresStorage

from mtrag_assets.definitions import ALL_ASSETS
from mtrag_assets.embedding_cache import embedding_cache
from mtrag_assets.runner import INSTANCE_YAML
from mtrag_resources.core import instance_file
from mtrag_resources.core.config import ENVIRONMENT
from mtrag_resources.embedding.embedder import EmbedderConfig
from mtrag_resources.embedding.onnx_runtime import backend_tag

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
VALUES = REPO / "deploy" / "helm" / "values.yaml"
INSTANCE = REPO / "deploy" / "dagster-k8s.yaml"
DOC = REPO / "docs" / "deploy.md"

RELEASE = NAMESPACE = "mtrag"   # docs/deploy.md: helm upgrade --install mtrag ... -n mtrag
# The steps that embed the corpus (a GPU helps): the chunk vectors. index_manifest embeds only the
# golden queries (a few dozen texts), qdrant_collection reads vectors from the cache.
EMBEDDING_STEPS = {embedding_cache.op.name}
CLASS_BLOCKS = ("run_coordinator", "run_launcher", "run_storage", "event_log_storage", "schedule_storage")
# The top-level keys of the chart's values model (helm/dagster/schema .../charts/dagster/values.py,
# read at the dagster-io/dagster source): a typo guard, not the chart's schema.
CHART_KEYS = {"global", "nameOverride", "fullnameOverride", "rbacEnabled", "dagsterWebserver", "dagit",
              "dagster-user-deployments", "postgresql", "generatePostgresqlPasswordSecret",
              "generateCeleryConfigSecret", "rabbitmq", "redis", "flower", "ingress", "imagePullSecrets",
              "computeLogManager", "scheduler", "runLauncher", "pythonLogs", "dagsterDaemon", "busybox",
              "migrate", "telemetry", "serviceAccount", "retention", "concurrency", "additionalInstanceConfig"}
MTRAG_KEY = "mtrag"  # this project's own block in values.yaml; the chart does not read it


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def values() -> dict:
    return load(VALUES)


@pytest.fixture(scope="module")
def k8s_instance() -> dict:
    return load(INSTANCE)


@pytest.fixture(scope="module")
def deployment(values) -> dict:
    (dep,) = values["dagster-user-deployments"]["deployments"]
    return dep


@pytest.fixture(scope="module")
def executor_config(values) -> dict:
    return values[MTRAG_KEY]["k8sJobExecutor"]


@pytest.fixture
def pg_env(monkeypatch):
    """The variables the two instances read their PostgreSQL password or URL from (set in a pod by
    the Secrets of docs/deploy.md)."""
    monkeypatch.setenv("MTRAG_DAGSTER_PG_URL", doc_pg_url())
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", "pw")


def doc_secret_keys(name: str) -> list[str]:
    """The keys docs/deploy.md's `kubectl create secret generic NAME` command puts in that Secret."""
    match = re.search(rf"create secret generic {re.escape(name)}((?:[^\n]*\\\n)*[^\n]*)", DOC.read_text())
    assert match, f"docs/deploy.md has no `kubectl ... create secret generic {name}` command"
    return re.findall(r"--from-literal=([A-Za-z0-9_.-]+)=", match.group(1))


def doc_pg_url() -> str:
    match = re.search(r"--from-literal=MTRAG_DAGSTER_PG_URL=(\S+)", DOC.read_text())
    assert match, "docs/deploy.md does not show MTRAG_DAGSTER_PG_URL in the mtrag-secrets command"
    return match.group(1).rstrip("\\").strip("'\"")


# -- the chart's rendering of dagster.yaml, transcribed from its templates --------------------------

# The templates read render `module: dagster.core.run_coordinator`; dagster 1.13.27 has no
# `dagster.core` package (it is `dagster._core`), so the 1.13.27 chart must render an importable path:
# docs/deploy.md says to check the rendered ConfigMap. This transcription uses the importable one.
RUN_COORDINATOR_MODULE = "dagster._core.run_coordinator"


def _set(config: dict, key: str, value) -> None:
    if value not in (None, [], {}, ""):
        config[key] = value


def chart_instance(values: dict) -> dict:
    """The dagster.yaml blocks the chart renders from `values` for what mtrag needs (run coordinator,
    run launcher, storage, concurrency, telemetry): helpers/instance/_run-coordinator.tpl,
    _run-launcher.tpl (K8sRunLauncher), _postgresql.tpl, _concurrency.tpl and configmap-instance.yaml
    of the chart source, by hand; the chart's defaults are not merged in (what is left unset here is
    left out)."""
    fullname = RELEASE if "dagster" in RELEASE else f"{RELEASE}-dagster"
    glob = values.get("global", {})
    doc: dict = {}

    pg = values["postgresql"]
    pg_config = {"postgres_db": {"username": pg["postgresqlUsername"], "password": {"env": "DAGSTER_PG_PASSWORD"},
                                 "hostname": pg["postgresqlHost"], "db_name": pg["postgresqlDatabase"],
                                 "port": pg["service"]["port"], "params": pg.get("postgresqlParams", {})}}
    for key, module, cls in (("run_storage", "dagster_postgres.run_storage", "PostgresRunStorage"),
                             ("event_log_storage", "dagster_postgres.event_log", "PostgresEventLogStorage"),
                             ("schedule_storage", "dagster_postgres.schedule_storage", "PostgresScheduleStorage")):
        doc[key] = {"module": module, "class": cls, "config": copy.deepcopy(pg_config)}

    launcher = values["runLauncher"]
    assert launcher["type"] == "K8sRunLauncher", "this deployment uses the K8sRunLauncher"
    k8s = launcher["config"]["k8sRunLauncher"]
    config = {"load_incluster_config": k8s["loadInclusterConfig"],
              "job_namespace": k8s.get("jobNamespace") or NAMESPACE,
              "image_pull_policy": k8s["imagePullPolicy"],
              "service_account_name": fullname,
              "dagster_home": glob.get("dagsterHome", "/opt/dagster/dagster_home"),
              "instance_config_map": f"{fullname}-instance",
              "postgres_password_secret": glob.get("postgresqlSecretName", "dagster-postgresql-secret")}
    _set(config, "kubeconfig_file", k8s.get("kubeconfigFile"))
    _set(config, "env_config_maps", [c["name"] for c in k8s.get("envConfigMaps", []) if "name" in c])
    _set(config, "env_secrets", [s["name"] for s in k8s.get("envSecrets", []) if "name" in s])
    for key, name in (("envVars", "env_vars"), ("volumeMounts", "volume_mounts"), ("volumes", "volumes"),
                      ("labels", "labels"), ("resources", "resources"), ("schedulerName", "scheduler_name"),
                      ("securityContext", "security_context")):
        _set(config, name, k8s.get(key))
    if k8s.get("failPodOnRunFailure"):
        config["fail_pod_on_run_failure"] = True
    run_k8s = {snake: k8s.get("runK8sConfig", {}).get(camel) for camel, snake in (
        ("containerConfig", "container_config"), ("podSpecConfig", "pod_spec_config"),
        ("podTemplateSpecMetadata", "pod_template_spec_metadata"), ("jobSpecConfig", "job_spec_config"),
        ("jobMetadata", "job_metadata"))}
    _set(config, "run_k8s_config", {k: v for k, v in run_k8s.items() if v})
    doc["run_launcher"] = {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": config}

    daemon = values["dagsterDaemon"]
    concurrency = values.get("concurrency", {})
    enabled = bool(concurrency.get("enabled"))
    if daemon.get("enabled", True) and daemon["runCoordinator"]["enabled"]:
        assert daemon["runCoordinator"]["type"] == "QueuedRunCoordinator"
        qrc = daemon["runCoordinator"]["config"].get("queuedRunCoordinator") or {}
        block = {"module": RUN_COORDINATOR_MODULE, "class": "QueuedRunCoordinator"}
        if any(v not in (None, [], {}, "", False, 0) for v in qrc.values()):
            cfg: dict = {}
            if not enabled or qrc.get("maxConcurrentRuns") is not None:
                cfg["max_concurrent_runs"] = -1 if qrc.get("maxConcurrentRuns") is None else qrc["maxConcurrentRuns"]
            _set(cfg, "tag_concurrency_limits", qrc.get("tagConcurrencyLimits"))
            for camel, snake in (("dequeueIntervalSeconds", "dequeue_interval_seconds"),
                                 ("dequeueUseThreads", "dequeue_use_threads"),
                                 ("dequeueNumWorkers", "dequeue_num_workers")):
                _set(cfg, snake, qrc.get(camel) or None)
            if qrc.get("blockOpConcurrencyLimitedRuns"):
                b = qrc["blockOpConcurrencyLimitedRuns"]
                cfg["block_op_concurrency_limited_runs"] = {"enabled": b["enabled"],
                                                            "op_concurrency_slot_buffer": b["opConcurrencySlotBuffer"]}
            block["config"] = cfg
        doc["run_coordinator"] = block

    if enabled:
        pools, runs = concurrency.get("pools", {}), concurrency.get("runs", {})
        rendered: dict = {}
        p: dict = {}
        if pools.get("defaultLimit") is not None:
            p["default_limit"] = pools["defaultLimit"]
        _set(p, "granularity", pools.get("granularity"))
        if pools.get("opGranularityRunBuffer") is not None:
            p["op_granularity_run_buffer"] = pools["opGranularityRunBuffer"]
        _set(rendered, "pools", p)
        r: dict = {}
        if runs.get("maxConcurrentRuns") is not None:
            r["max_concurrent_runs"] = runs["maxConcurrentRuns"]
        _set(r, "tag_concurrency_limits", [{k: v for k, v in limit.items() if v is not None}
                                           for limit in runs.get("tagConcurrencyLimits", [])])
        _set(rendered, "runs", r)
        doc["concurrency"] = rendered
    doc["telemetry"] = {"enabled": values.get("telemetry", {}).get("enabled", True)}
    return doc


# -- Dagster's validation -------------------------------------------------------------------------

def validate_instance(doc: dict, folder: Path) -> dict:
    """What loading `doc` as $DAGSTER_HOME/dagster.yaml checks before anything connects: the instance
    schema and the concurrency rules (`dagster_instance_config`), then each configurable class's own
    config schema, as `ConfigurableClassData.rehydrate` applies it (the classes are not built: the
    K8sRunLauncher would load a cluster's credentials, the storage would connect)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dagster.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    config, _ = dagster_instance_config(str(folder))
    for key in CLASS_BLOCKS:
        if key in doc:
            klass = class_from_code_pointer(doc[key]["module"], doc[key]["class"])
            result = process_config(klass.config_type(), doc[key].get("config") or {})
            if not result.success:
                raise DagsterInvalidConfigError(f"{key} config", result.errors, doc[key].get("config"))
    if "postgres" in doc.get("storage", {}):
        result = process_config(DagsterPostgresStorage.config_type(), doc["storage"]["postgres"])
        if not result.success:
            raise DagsterInvalidConfigError("storage.postgres config", result.errors, doc["storage"]["postgres"])
    return config


def wanted() -> dict:
    return yaml.safe_load(INSTANCE_YAML)["concurrency"]


def test_the_hand_written_instance_validates_as_dagster_loads_it(k8s_instance, pg_env, tmp_path):
    config = validate_instance(k8s_instance, tmp_path / "home")
    assert config["storage"] == {"postgres": {"postgres_url": {"env": "MTRAG_DAGSTER_PG_URL"}}}
    assert config["run_launcher"]["class"] == "K8sRunLauncher"
    # the very file, loaded from where it lives, passes the same checks
    dagster_instance_config(str(INSTANCE.parent), INSTANCE.name)


def test_what_the_chart_renders_from_values_validates(values, pg_env, tmp_path):
    rendered = chart_instance(values)
    config = validate_instance(rendered, tmp_path / "chart")
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    # the limits live in `concurrency`, none in the run coordinator (Dagster refuses both at once)
    assert "config" not in rendered["run_coordinator"]


def test_both_instances_have_exactly_mtrag_s_pools_and_run_tag_limit(values, k8s_instance):
    for name, doc in (("deploy/dagster-k8s.yaml", k8s_instance), ("values.yaml via the chart", chart_instance(values))):
        have = doc["concurrency"]
        assert have["pools"] == wanted()["pools"], name
        assert have["runs"]["tag_concurrency_limits"] == wanted()["runs"]["tag_concurrency_limits"], name
        assert "tag_concurrency_limits" not in doc["run_coordinator"].get("config", {}), name


def test_mtrag_s_own_instance_check_finds_nothing_to_say(values, k8s_instance):
    """mtrag build / mtrag watch in a pod check dagster.yaml (instance_file): with MTRAG_DAGSTER_PG_URL
    set (docs/deploy.md's Secret) the hand-written file, and the chart's rendering of the same
    database, differ in nothing from what mtrag needs; without the URL the chart's is fine too."""
    url = doc_pg_url()
    assert instance_file.differences(INSTANCE.read_text(), INSTANCE_YAML, url) == []
    chart_text = yaml.safe_dump(chart_instance(values))
    assert instance_file.differences(chart_text, INSTANCE_YAML, url) == []
    assert instance_file.differences(chart_text, INSTANCE_YAML, None) == []


def test_the_two_run_launchers_give_pods_the_same_env_secret_and_volume(values, deployment, k8s_instance):
    chart = chart_instance(values)["run_launcher"]["config"]
    hand = k8s_instance["run_launcher"]["config"]
    for key in ("env_secrets", "volumes", "volume_mounts", "image_pull_policy", "dagster_home"):
        assert chart[key] == hand[key], key
    # the chart hands the code location's env to run pods (includeConfigInLaunchedRuns); the
    # hand-written launcher sets the same variables itself
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True
    assert dict(v.split("=", 1) for v in hand["env_vars"]) == {e["name"]: e["value"] for e in deployment["env"]}
    assert deployment["volumes"] == chart["volumes"] and deployment["volumeMounts"] == chart["volume_mounts"]
    assert [s["name"] for s in deployment["envSecrets"]] == hand["env_secrets"]


def test_the_code_location_is_the_workspace_s(deployment):
    workspace = load(REPO / "workspace.yaml")
    (entry,) = workspace["load_from"]
    args = deployment["dagsterApiGrpcArgs"]
    assert args[args.index("-m") + 1] == entry["python_module"]["module_name"] == "mtrag_assets.definitions"


def test_every_variable_set_is_one_mtrag_declares(values, deployment, executor_config, k8s_instance):
    names = [e["name"] for e in deployment["env"]]
    names += [v.split("=", 1)[0] for v in k8s_instance["run_launcher"]["config"]["env_vars"]]
    names += [e["name"] for step in executor_config["per_step_k8s_config"].values()
              for e in step.get("container_config", {}).get("env", [])]
    names += doc_secret_keys("mtrag-secrets")

    def env_refs(node):
        if isinstance(node, dict):
            if set(node) == {"env"} and isinstance(node["env"], str):
                yield node["env"]
            for value in node.values():
                yield from env_refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from env_refs(value)

    read = list(env_refs(k8s_instance))
    assert read == ["MTRAG_DAGSTER_PG_URL"]
    undeclared = sorted(set(names + read) - set(ENVIRONMENT))
    assert undeclared == [], f"not in mtrag_resources/core/config.py ENVIRONMENT: {undeclared}"
    # what the instance file reads is in the Secret every pod gets
    assert set(read) <= set(doc_secret_keys("mtrag-secrets"))
    assert {"QDRANT_API_KEY", "NEO4J_USER", "NEO4J_PASSWORD"} <= set(doc_secret_keys("mtrag-secrets"))


def test_pods_use_servers_and_the_shared_volume(deployment):
    env = {e["name"]: e["value"] for e in deployment["env"]}
    # the embedded Qdrant folder is one process's, and a pod without NEO4J_URI starts its own Neo4j
    assert env["QDRANT_URL"].startswith(("http://", "https://"))
    assert env["NEO4J_URI"].startswith(("bolt://", "neo4j://", "bolt+s://", "neo4j+s://"))
    (claim,) = [v for v in deployment["volumes"] if "persistentVolumeClaim" in v]
    (mount,) = [m for m in deployment["volumeMounts"] if m["name"] == claim["name"]]
    for name in ("MTRAG_HOME", "MTRAG_SOURCES"):
        assert Path(env[name]).is_relative_to(mount["mountPath"]), name


def test_the_executor_config_validates_and_names_real_steps(executor_config):
    result = process_config(k8s_job_executor.config_schema.config_type, executor_config)
    assert result.success, result.errors
    ops = {a.op.name for a in ALL_ASSETS}
    assert set(executor_config["per_step_k8s_config"]) <= ops


def gpu_steps(executor_config) -> set[str]:
    return {name for name, step in executor_config["per_step_k8s_config"].items()
            if "nvidia.com/gpu" in step.get("container_config", {}).get("resources", {}).get("limits", {})}


def step_job(deployment, step_config: dict):
    """The Kubernetes Job dagster-k8s builds for a step pod: the code location's env, Secret, volume
    and resources (what the chart hands to launched runs), then the step's own config over them."""
    base = DagsterK8sJobConfig(
        job_image=f"{deployment['image']['repository']}:{deployment['image']['tag']}",
        dagster_home="/opt/dagster/dagster_home", instance_config_map=f"{RELEASE}-dagster-instance",
        env_secrets=[s["name"] for s in deployment["envSecrets"]],
        env_vars=[f"{e['name']}={e['value']}" for e in deployment["env"]],
        volumes=deployment["volumes"], volume_mounts=deployment["volumeMounts"], resources=deployment["resources"])
    return construct_dagster_k8s_job(base, ["dagster", "api", "execute_step"], "dagster-step-test",
                                     user_defined_k8s_config=UserDefinedDagsterK8sConfig.from_dict(step_config))


def test_only_the_embedding_step_goes_to_the_gpu_node(deployment, executor_config):
    assert gpu_steps(executor_config) == EMBEDDING_STEPS
    step = executor_config["per_step_k8s_config"][embedding_cache.op.name]
    pod = step_job(deployment, step).spec.template.spec
    (container,) = pod.containers
    env = {e.name: e.value for e in container.env}
    assert container.resources.limits["nvidia.com/gpu"] == "1"
    assert pod.node_selector and all(isinstance(v, str) for v in pod.node_selector.values())
    assert any(t.key == "nvidia.com/gpu" for t in pod.tolerations)
    assert env["MTRAG_EMBED_DEVICE"] == "cuda" and env["MTRAG_HOME"] == "/var/lib/mtrag/home"
    assert [m.mount_path for m in container.volume_mounts if m.name == "mtrag-home"] == ["/var/lib/mtrag"]
    # every other step keeps the code location's CPU-only pod
    cpu_pod = step_job(deployment, {}).spec.template.spec
    assert not cpu_pod.node_selector and "nvidia.com/gpu" not in (cpu_pod.containers[0].resources.limits or {})


def test_cpu_pods_and_the_gpu_step_compute_one_embedder_fingerprint(deployment, executor_config, monkeypatch):
    """The backend is in the fingerprint (embedding cache key, manifest) and defaults by device
    (onnx-int8 on the CPU, torch on cuda): qdrant_collection and index_manifest on CPU pods must
    agree with embedding_cache on the GPU, so the shared env names the backend."""
    assert backend_tag(EmbedderConfig(device="cpu").backend) != backend_tag(EmbedderConfig(device="cuda").backend)
    for name in ENVIRONMENT:
        if name.startswith("MTRAG_EMBED_"):
            monkeypatch.delenv(name, raising=False)
    for e in deployment["env"]:
        monkeypatch.setenv(e["name"], e["value"])
    cpu = EmbedderConfig.from_env()
    for e in executor_config["per_step_k8s_config"][embedding_cache.op.name]["container_config"]["env"]:
        monkeypatch.setenv(e["name"], e["value"])
    gpu = EmbedderConfig.from_env()
    assert (cpu.device, gpu.device) == ("cpu", "cuda")
    assert backend_tag(cpu.backend) == backend_tag(gpu.backend) and cpu.model == gpu.model


def test_values_use_only_chart_keys_at_the_top(values):
    assert set(values) - CHART_KEYS == {MTRAG_KEY}


# -- a broken block fails: the validation above really runs ----------------------------------------

def test_a_broken_instance_fails_dagster_s_validation(k8s_instance, pg_env, tmp_path):
    bad = copy.deepcopy(k8s_instance)
    bad["concurrency"]["pools"]["default_limit"] = -1
    with pytest.raises(DagsterInvalidConfigError, match="default_limit"):
        validate_instance(bad, tmp_path / "a")
    bad = copy.deepcopy(k8s_instance)
    bad["concurrency"]["pools"]["default_limt"] = bad["concurrency"]["pools"].pop("default_limit")  # typo
    with pytest.raises(DagsterInvalidConfigError):
        validate_instance(bad, tmp_path / "a2")
    bad = copy.deepcopy(k8s_instance)
    bad["run_launcher"]["config"]["job_namspace"] = "mtrag"  # typo
    with pytest.raises(DagsterInvalidConfigError, match="run_launcher"):
        validate_instance(bad, tmp_path / "b")
    bad = copy.deepcopy(k8s_instance)
    bad["run_coordinator"]["module"] = "dagster.core.run_coordinator"  # the pre-1.13 path
    with pytest.raises(Exception, match="dagster.core.run_coordinator"):
        validate_instance(bad, tmp_path / "c")
    bad = copy.deepcopy(k8s_instance)
    del bad["storage"]
    assert [d.key for d in instance_file.differences(yaml.safe_dump(bad), INSTANCE_YAML, doc_pg_url())] == ["storage"]


def test_limits_in_both_the_queue_and_concurrency_are_refused(values, pg_env, tmp_path):
    bad = copy.deepcopy(values)
    qrc = bad["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    qrc["tagConcurrencyLimits"] = copy.deepcopy(bad["concurrency"]["runs"]["tagConcurrencyLimits"])
    with pytest.raises(DagsterInvalidConfigError, match="tag_concurrency_limits"):
        validate_instance(chart_instance(bad), tmp_path / "both")
    # and with the chart's concurrency block off, the queue renders max_concurrent_runs -1, which is fine
    off = copy.deepcopy(values)
    off["concurrency"]["enabled"] = False
    off["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]["dequeueNumWorkers"] = 4
    assert validate_instance(chart_instance(off), tmp_path / "off")["run_coordinator"]["config"]["max_concurrent_runs"] == -1


def test_a_broken_executor_or_step_config_fails(deployment, executor_config):
    bad = copy.deepcopy(executor_config)
    bad["per_step_k8s_config"][embedding_cache.op.name]["pod_spec_confg"] = {}
    assert not process_config(k8s_job_executor.config_schema.config_type, bad).success
    bad = copy.deepcopy(executor_config["per_step_k8s_config"][embedding_cache.op.name])
    bad["pod_spec_config"]["nodeSelectr"] = bad["pod_spec_config"].pop("node_selector")
    with pytest.raises(Exception, match="nodeSelectr"):
        step_job(deployment, bad)
