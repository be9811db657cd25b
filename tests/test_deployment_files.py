"""The deployment files stay true to the code: compose services, env names, the Dockerfile
lint, `.env.example` and the committed `openapi.yaml`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import render_openapi
from app.kit.config import PROJECT_ROOT, Settings

SETTING_NAMES = {name.upper() for name in Settings.model_fields}


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
    return data


def test_compose_has_the_four_services() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", "migrate", "api", "worker"}
    assert services["migrate"]["command"] == ["python", "-m", "app", "migrate"]
    assert services["migrate"]["restart"] == "no"
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )
        assert services[name]["deploy"]["replicas"] >= 2
    assert services["api"]["environment"]["WORKER_ENABLED"] == "false"
    assert services["worker"]["command"][-1] == "worker"


def test_compose_healthchecks() -> None:
    services = compose()["services"]
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert "/readyz" in " ".join(services["api"]["healthcheck"]["test"])
    assert services["worker"]["healthcheck"]["test"][-2:] == ["worker", "--check"]


def test_every_compose_env_name_is_a_setting() -> None:
    services = compose()["services"]
    for name in ("migrate", "api", "worker"):
        unknown = set(services[name]["environment"]) - SETTING_NAMES
        assert not unknown, f"{name}: {unknown} are not Settings fields"


def test_env_example_lists_every_setting() -> None:
    text = (PROJECT_ROOT / ".env.example").read_text()
    listed = set(re.findall(r"^#? ?([A-Z][A-Z0-9_]+)=", text, flags=re.MULTILINE))
    assert listed == SETTING_NAMES


def test_env_example_defaults_match_settings() -> None:
    text = (PROJECT_ROOT / ".env.example").read_text()
    values = dict(re.findall(r"^([A-Z][A-Z0-9_]+)=(.*)$", text, flags=re.MULTILINE))
    env = {k: v for k, v in values.items() if k not in {"EMBEDDED_PG_DIR"}}
    from_file = Settings(_env_file=None, **{k.lower(): v for k, v in env.items()})
    defaults = Settings(_env_file=None)
    for name in env:
        assert getattr(from_file, name.lower()) == getattr(defaults, name.lower()), name


def test_dockerfile_is_multistage_and_non_root() -> None:
    text = (PROJECT_ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, flags=re.MULTILINE)) >= 2
    assert re.search(r"^USER 10001", text, flags=re.MULTILINE)
    assert "HEALTHCHECK" in text
    final_stage = text.split("FROM ")[-1]
    assert "pip install" not in final_stage  # no build tooling used in the final image


def test_dockerfile_lint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.fail("hadolint is a dev dependency; reinstall with `make` targets")
    result = subprocess.run(
        [hadolint, str(PROJECT_ROOT / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_openapi_yaml_matches_the_app() -> None:
    settings = Settings(_env_file=None)
    committed = (PROJECT_ROOT / "openapi.yaml").read_text(encoding="utf-8")
    assert committed == render_openapi(settings), "openapi.yaml drifted: run `make openapi`"
