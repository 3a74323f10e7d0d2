"""``auth:`` is checked at start-up: the file's shape by the config loader (``ConfigError`` naming
the key), what needs the environment or user code when the gateway is built (``AuthSetupError``
naming the key), and ``keel serve`` says so and exits 2 instead of serving unprotected."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentkeel.config import ConfigError, load_config
from agentkeel.gateway.auth import AuthSetupError, build_authenticator


def load(tmp_path: Path, auth: dict[str, Any]) -> Any:
    path = tmp_path / "keel.yaml"
    path.write_text(yaml.safe_dump({"auth": auth}))
    return load_config(path, env={})


@pytest.mark.parametrize(("auth", "message"), [
    ({"mode": "api_keys"}, "needs at least one"),
    ({"mode": "api_keys", "api_keys": [{"user": "a", "key_env": "K1"}, {"user": "a", "key_env": "K2"}]}, "duplicate user"),
    ({"mode": "api_keys", "api_keys": [{"user": "a", "key_env": "K1"}, {"user": "b", "key_env": "K1"}]}, "duplicate key_env"),
    ({"mode": "api_keys", "api_keys": [{"user": " ", "key_env": "K1"}]}, "must not be blank"),
    ({"mode": "none", "api_keys": [{"user": "a", "key_env": "K1"}]}, "auth.mode is 'none'"),
    ({"mode": "jwt"}, "exactly one of secret_env"),
    ({"mode": "jwt", "jwt": {"secret_env": "S", "jwks_url": "https://idp.example/jwks"}}, "exactly one of secret_env"),
    ({"mode": "jwt", "jwt": {"secret_env": "S", "algorithms": ["RS256"]}}, "do not fit secret_env"),
    ({"mode": "jwt", "jwt": {"jwks_url": "https://idp.example/jwks", "algorithms": ["HS256"]}}, "do not fit jwks_url"),
    ({"mode": "jwt", "jwt": {"jwks_url": "https://idp.example/jwks", "algorithms": ["none"]}}, "never 'none'"),
    ({"mode": "jwt", "jwt": {"jwks_url": "file:///etc/jwks"}}, "not an http(s) URL"),
    ({"mode": "langgraph"}, "needs path"),
    ({"mode": "api_keys", "path": "./auth.py:auth", "api_keys": [{"user": "a", "key_env": "K"}]}, "only applies to mode 'langgraph'"),
    ({"mode": "basic"}, "auth.mode"),
    ({"mode": "none", "tokens": []}, "auth.tokens"),
])
def test_config_shape_errors_name_the_key(tmp_path: Path, auth: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, auth)
    assert message in str(caught.value) and "auth" in str(caught.value), str(caught.value)


def test_hmac_algorithms_default_with_a_secret(tmp_path: Path) -> None:
    assert load(tmp_path, {"mode": "jwt", "jwt": {"secret_env": "S"}}).auth.jwt.algorithms == ["HS256"]
    assert load(tmp_path, {"mode": "jwt", "jwt": {"jwks_url": "https://idp.example/jwks"}}).auth.jwt.algorithms == ["RS256"]
    assert load(tmp_path, {}).auth.mode == "none"


def test_api_key_variables_are_checked_when_the_gateway_is_built(tmp_path: Path) -> None:
    keys = [{"user": "alice", "key_env": "KEY_A"}, {"user": "bob", "key_env": "KEY_B"}]
    config = load(tmp_path, {"mode": "api_keys", "api_keys": keys})
    with pytest.raises(AuthSetupError, match=r"^auth\.api_keys\.1\.key_env: environment variable KEY_B is not set"):
        build_authenticator(config.auth, tmp_path, {"KEY_A": "a" * 20})
    with pytest.raises(AuthSetupError, match=r"^auth\.api_keys\.0\.key_env"):
        build_authenticator(config.auth, tmp_path, {"KEY_A": "  ", "KEY_B": "b" * 20})
    with pytest.raises(AuthSetupError, match=r"^auth\.api_keys\.1\.key_env: the same key as auth\.api_keys\.0"):
        build_authenticator(config.auth, tmp_path, {"KEY_A": "same-key", "KEY_B": "same-key"})
    assert build_authenticator(config.auth, tmp_path, {"KEY_A": "a" * 20, "KEY_B": "b" * 20}) is not None
    assert build_authenticator(load(tmp_path, {}).auth, tmp_path, {}) is None


def test_jwt_secret_is_checked_when_the_gateway_is_built(tmp_path: Path) -> None:
    config = load(tmp_path, {"mode": "jwt", "jwt": {"secret_env": "JWT_SECRET"}})
    with pytest.raises(AuthSetupError, match=r"^auth\.jwt\.secret_env: environment variable JWT_SECRET is not set"):
        build_authenticator(config.auth, tmp_path, {})
    with pytest.raises(AuthSetupError, match="shorter than 32 bytes"):
        build_authenticator(config.auth, tmp_path, {"JWT_SECRET": "short"})
    assert build_authenticator(config.auth, tmp_path, {"JWT_SECRET": "s" * 32}) is not None


@pytest.mark.parametrize(("source", "message"), [
    ("auth = 42\n", "is a int, not a langgraph_sdk.Auth"),
    ("from langgraph_sdk import Auth\nauth = Auth()\n", "has no @auth.authenticate handler"),
    ("from langgraph_sdk import Auth\nauth = Auth()\n@auth.authenticate\nasync def who(token: str) -> str:\n    return token\n",
     "asks for ['token']"),
    ("raise RuntimeError('broken on import')\n", "cannot import"),
    ("other = 1\n", "has no attribute 'auth'"),
])
def test_langgraph_path_must_be_an_auth_with_a_handler(tmp_path: Path, source: str, message: str) -> None:
    (tmp_path / "auth.py").write_text(source)
    config = load(tmp_path, {"mode": "langgraph", "path": "./auth.py:auth"})
    with pytest.raises(AuthSetupError) as caught:
        build_authenticator(config.auth, config.base_dir, {})
    assert str(caught.value).startswith("auth.path:") and message in str(caught.value), str(caught.value)


def test_langgraph_path_resolves_against_the_config_file(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "auth.py").write_text(textwrap.dedent("""
        from langgraph_sdk import Auth
        auth = Auth()

        @auth.authenticate
        async def who(authorization: str | None) -> str:
            return "someone"
    """))
    (project / "keel.yaml").write_text(yaml.safe_dump({"auth": {"mode": "langgraph", "path": "./auth.py:auth"}}))
    config = load_config(project / "keel.yaml", env={})
    assert build_authenticator(config.auth, config.base_dir, {}) is not None


def keel(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTKEEL_", "KEEL_TEST_"))}
    full.update({"COLUMNS": "200", "NO_COLOR": "1"})
    return subprocess.run([sys.executable, "-m", "agentkeel.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=120)


def test_serve_with_auth_may_bind_beyond_loopback_but_not_with_a_missing_key(tmp_path: Path) -> None:
    """With ``auth.mode`` set, ``--host 0.0.0.0`` passes the exposure check without ``--insecure``;
    the unset key variable then stops start-up (exit 2, the key path named) before anything listens."""
    (tmp_path / "keel.yaml").write_text(yaml.safe_dump(
        {"data_dir": str(tmp_path / "data"), "auth": {"mode": "api_keys", "api_keys": [{"user": "alice", "key_env": "KEEL_TEST_KEY"}]}}
    ))
    result = keel("serve", "--config", "keel.yaml", "--host", "0.0.0.0", "--port", "0", cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "auth.api_keys.0.key_env: environment variable KEEL_TEST_KEY is not set" in result.stderr
    assert "no authentication" not in result.stderr and "Traceback" not in result.stderr

    bad = keel("serve", "--config", "keel.yaml", "--port", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "KEEL_TEST_KEY" in bad.stderr  # loopback too: never serves unprotected


@pytest.mark.parametrize("auth", [
    {},
    {"mode": "api_keys", "api_keys": [{"user": "a", "key_env": "K1"}]},
    {"mode": "jwt", "jwt": {"secret_env": "S", "audience": ["x", "y"]}},
    {"mode": "jwt", "jwt": {"jwks_url": "https://idp.example/jwks", "issuer": "https://idp.example"}},
    {"mode": "langgraph", "path": "./auth.py:auth"},
])
def test_a_dumped_config_reloads(tmp_path: Path, auth: dict[str, Any]) -> None:
    """Every key at its value (defaults included) must load again: tools write configs this way."""
    config = load(tmp_path, auth)
    again = load(tmp_path, config.model_dump(mode="json")["auth"])
    assert again.auth == config.auth
