"""AgentKeel's configuration: one YAML file plus environment overrides, validated at start-up.

Every key is optional; an unknown key or a wrong type stops start-up with the key path in the
message (``ConfigError``), because a typo in a guard's threshold silently falling back to a default
is exactly the kind of surprise this runtime exists to remove.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)

from agentkeel.database import Database, DatabasePool, DatabaseUrl, as_database_url
from agentkeel.limits import Limits, SubagentSummarizationLimits
from agentkeel.sandbox.bwrap import BashSandbox, find_bwrap

log = logging.getLogger(__name__)

BUNDLED_SCRIPTS = Path(__file__).parent / "harness" / "scripts"
DEFAULT_SKILLS_DIR = "./skills"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# Provider keyword arguments AgentKeel sets itself (with the key to use instead): passing one
# through ``options`` would silently undo a guarantee (one retry layer, a bounded call, streamed
# usage) or bypass the key variable.
RESERVED_OPTIONS = {
    "model": "use", "model_name": "use", "model_provider": "use",
    "api_key": "api_key_env", "openai_api_key": "api_key_env", "anthropic_api_key": "api_key_env",
    "base_url": "base_url", "openai_api_base": "base_url", "anthropic_api_url": "base_url",
    "timeout": "timeout_s", "request_timeout": "timeout_s", "default_request_timeout": "timeout_s",
    "temperature": "temperature",
    "max_retries": "limits.llm_retry.max_attempts (the provider client's own retries are always off)",
    "stream_usage": None,  # always on where the client has the switch, so budgets bind on streams
}


class ModelConfig(_Strict):
    name: str
    use: str  # "scripted" or "<provider>:<model>"
    script: str | None = None
    api_key_env: str | None = None
    base_url: str | None = None
    temperature: float | None = None
    timeout_s: Annotated[float, Field(gt=0)] = 60.0  # bounds one model call (provider models)
    options: dict[str, Any] = Field(default_factory=dict)  # provider keyword arguments, passed through

    @field_validator("name")
    @classmethod
    def _name_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v

    @field_validator("options")
    @classmethod
    def _options_not_ours(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if key in RESERVED_OPTIONS:
                instead = RESERVED_OPTIONS[key]
                hint = f"; use {instead}" if instead else " (AgentKeel always sets it)"
                raise ValueError(f"{key!r} is set by AgentKeel, not through options{hint}")
        return v

    @model_validator(mode="after")
    def _options_for_providers(self) -> ModelConfig:
        if self.options and self.use == "scripted":
            raise ValueError("options: only provider models (use: '<provider>:<model>') take options")
        return self


class AssistantConfig(_Strict):
    assistant_id: str
    model: str | None = None  # defaults to the first model
    system_prompt: str | None = None
    tools: list[str] | None = None  # default: every built-in tool that is enabled
    # Extra LangChain middleware, "module:Class" (zero-argument constructor). Placed by the chain
    # builder from its contract, or conservatively when it declares none.
    middleware: list[str] = Field(default_factory=list)
    # When the worker running one of this assistant's runs is lost: ``fail`` ends the run as error
    # (stop reason ``worker_lost``); ``resume`` continues it from its last checkpoint.
    on_worker_lost: Literal["fail", "resume"] = "fail"


class ToolsConfig(_Strict):
    """Which optional tools are on and how ``bash`` is confined (see docs/security.md)."""

    bash: bool = False
    # Run bash without bubblewrap (today's behaviour before the sandbox): no isolation at all.
    bash_unsandboxed: bool = False
    bash_network: bool = False  # let sandboxed commands reach the network
    bash_cpu_s: Annotated[int, Field(ge=1)] = 60  # CPU seconds per command (RLIMIT_CPU)
    bash_memory_mb: Annotated[int, Field(ge=16)] = 2048  # address space per process (RLIMIT_AS)
    bash_max_processes: Annotated[int, Field(ge=1)] = 256  # processes of the command (RLIMIT_NPROC)
    bash_max_file_mb: Annotated[int, Field(ge=1)] = 1024  # largest file written (RLIMIT_FSIZE); also /tmp's size
    bash_hide: list[str] = Field(default_factory=list)  # host paths hidden besides data_dir (config, secrets)
    bash_root_uid: Annotated[int, Field(ge=1)] = 65534  # the uid commands run as when the server is root

    @model_validator(mode="after")
    def _sandbox_available(self) -> ToolsConfig:
        if self.bash and not self.bash_unsandboxed:
            if find_bwrap() is None:
                raise ValueError(
                    "tools.bash: enabled but bubblewrap (bwrap) is not installed; install it "
                    "(Debian package bubblewrap) or set tools.bash_unsandboxed: true to run "
                    "commands with no isolation"
                )
        elif self.bash:
            log.warning(
                "tools.bash_unsandboxed: bash commands run without a sandbox: they can read the "
                "server's environment and files and write anywhere the server can"
            )
        return self


class CorsConfig(_Strict):
    """Which browser origins may call the gateway (``gateway.cors``). Unset: pages served from a
    loopback origin (``http://localhost:<any port>``, ``127.0.0.1``, ``[::1]``), so a local chat UI
    works out of the box while a web page on another site cannot drive a local agent."""

    allow_origins: list[str] | None = None  # exact origins, or ["*"] for any; None = loopback origins
    max_age_s: Annotated[int, Field(ge=0)] = 600  # how long a browser may cache a preflight answer

    @field_validator("allow_origins")
    @classmethod
    def _origins(cls, origins: list[str] | None) -> list[str] | None:
        for origin in origins or []:
            if origin != "*" and (not origin.startswith(("http://", "https://")) or origin.endswith("/")):
                raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], no path) or '*'")
        return origins


class GatewayConfig(_Strict):
    """The HTTP gateway (``keel serve``): stream framing, shutdown bounds and browser access."""

    end_event: bool = False  # send `event: end` before closing a run stream (the Python SDK yields it)
    heartbeat_s: Annotated[float, Field(gt=0, le=5)] = 5.0  # SSE `: heartbeat` comment interval
    drain_s: Annotated[float, Field(ge=0)] = 10.0  # on SIGTERM: how long runs may finish before being interrupted
    wait_keepalive_s: Annotated[float, Field(gt=0)] = 5.0  # whitespace keep-alive interval of /wait and /join
    cors: CorsConfig = Field(default_factory=CorsConfig)
    # Names the ``Host`` header may carry (no port; ``["*"]``: any). None: the loopback names plus
    # the address ``keel serve --host`` binds, so a DNS-rebinding page cannot drive the API.
    allowed_hosts: list[str] | None = None
    # Input limits (``gateway.input_limits``): a bigger body is a 413, the rest a 422 naming the field.
    max_body_bytes: Annotated[int, Field(gt=0)] = 2 * 1024 * 1024
    max_json_depth: Annotated[int, Field(ge=2, le=256)] = 32  # nesting of any JSON body
    max_messages: Annotated[int, Field(gt=0)] = 1000  # length of any ``messages`` list in a body
    max_metadata_bytes: Annotated[int, Field(gt=0)] = 64 * 1024  # a body's ``metadata``, serialized

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, hosts: list[str] | None) -> list[str] | None:
        for host in hosts or []:
            bare = host.strip("[]")
            has_port = ":" in bare and bare.count(":") == 1  # more colons: an IPv6 address
            if not bare or has_port or "/" in bare or bare != bare.strip():
                raise ValueError(f"{host!r} is not a host name or address (no scheme, port or path) or '*'")
        return hosts


class WorkerConfig(_Strict):
    """``keel worker``: its own Prometheus endpoint (``/metrics``, ``/healthz``), off unless a port is set."""

    metrics_port: Annotated[int, Field(ge=0, le=65535)] | None = None  # 0: any free port
    metrics_host: str = "127.0.0.1"  # no authentication: loopback unless the network in front decides


HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
PUBLIC_KEY_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"})


class ApiKeyConfig(_Strict):
    """One caller of ``auth.mode: api_keys``: its key is read from ``key_env`` at start-up, so the
    config file itself holds no secret."""

    user: str
    key_env: str
    permissions: list[str] = Field(default_factory=list)  # "admin" makes the caller an admin

    @field_validator("user", "key_env")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v


class JwtConfig(_Strict):
    """``auth.mode: jwt``: a shared secret (HS*) or the issuer's JWKS (RS*/PS*/ES*/EdDSA), never both."""

    secret_env: str | None = None
    jwks_url: str | None = None
    algorithms: list[str] = Field(default_factory=lambda: ["RS256"])  # unset with secret_env: ["HS256"]
    issuer: str | None = None
    audience: str | list[str] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> JwtConfig:
        if self.secret_env is not None and self.jwks_url is not None:
            raise ValueError("set exactly one of secret_env (HS*) and jwks_url (RS*/ES*), not both")
        if self.secret_env is not None and "algorithms" not in self.model_fields_set:
            self.algorithms = ["HS256"]
        if not self.algorithms:
            raise ValueError("algorithms: must not be empty")
        unknown = sorted(set(self.algorithms) - HMAC_ALGORITHMS - PUBLIC_KEY_ALGORITHMS)
        if unknown:
            raise ValueError(f"algorithms: {unknown} not supported (HS*, RS*, PS*, ES*, EdDSA; never 'none')")
        if self.jwks_url is not None and not self.jwks_url.startswith(("https://", "http://")):
            raise ValueError(f"jwks_url: {self.jwks_url!r} is not an http(s) URL")
        if self.secret_env is not None and not set(self.algorithms) <= HMAC_ALGORITHMS:
            raise ValueError(f"algorithms: {self.algorithms} do not fit secret_env (a shared secret signs HS256/HS384/HS512)")
        if self.jwks_url is not None and not set(self.algorithms) <= PUBLIC_KEY_ALGORITHMS:
            raise ValueError(f"algorithms: {self.algorithms} do not fit jwks_url (public keys verify RS*/PS*/ES*/EdDSA)")
        return self


class AuthConfig(_Strict):
    """Who may call the gateway (``auth:``); see docs/security.md. Settings of a mode other than
    the chosen one are refused: a key list left under ``mode: none`` would look protected and not be.
    What needs the environment or user code (key values, the secret, ``path``) is checked when the
    gateway starts (``gateway/auth.py``), so a ``keel worker`` sharing this file needs none of it."""

    mode: Literal["none", "api_keys", "jwt", "langgraph"] = "none"
    api_keys: list[ApiKeyConfig] = Field(default_factory=list)
    jwt: JwtConfig = Field(default_factory=JwtConfig)
    path: str | None = None  # mode langgraph: './auth.py:auth' (relative to the config file), a langgraph_sdk.Auth

    @model_validator(mode="after")
    def _mode_settings(self) -> AuthConfig:
        jwt_set = any(v is not None for v in (self.jwt.secret_env, self.jwt.jwks_url, self.jwt.issuer, self.jwt.audience))
        # By value, not by the keys given: a dumped config (every key, at its default) must reload.
        for key, mode, given in (("api_keys", "api_keys", bool(self.api_keys)), ("jwt", "jwt", jwt_set),
                                 ("path", "langgraph", self.path is not None)):
            if given and self.mode != mode:
                raise ValueError(f"{key}: set, but auth.mode is {self.mode!r} (it only applies to mode {mode!r})")
        if self.mode == "api_keys":
            if not self.api_keys:
                raise ValueError("api_keys: mode api_keys needs at least one {user, key_env}")
            for what in ("user", "key_env"):
                values = [getattr(k, what) for k in self.api_keys]
                duplicates = sorted({v for v in values if values.count(v) > 1})
                if duplicates:
                    raise ValueError(f"api_keys: duplicate {what}(s) {duplicates}")
        if self.mode == "jwt" and (self.jwt.secret_env is None) == (self.jwt.jwks_url is None):
            raise ValueError("jwt: set exactly one of secret_env (HS*) and jwks_url (RS*/ES*)")
        if self.mode == "langgraph" and (not self.path or ":" not in self.path):
            raise ValueError("path: mode langgraph needs path: './auth.py:auth' (a langgraph_sdk.Auth instance)")
        return self

    def secret_envs(self) -> list[str]:
        """The environment variables holding this mode's secrets (redacted like model keys)."""
        if self.mode == "api_keys":
            return [k.key_env for k in self.api_keys]
        return [self.jwt.secret_env] if self.mode == "jwt" and self.jwt.secret_env else []


GENERAL_PURPOSE = "general-purpose"
"""The subagent type that always exists (its settings may be overridden under ``subagents.types``)."""


class SubagentTypeConfig(_Strict):
    """One kind of subagent the ``task`` tool can start (``subagents.types``)."""

    name: str
    description: str = ""
    system_prompt: str | None = None  # None: the built-in general-purpose prompt
    tools: list[str] | None = None  # allow list of built-in tools; None: every enabled one
    disallowed_tools: list[str] = Field(default_factory=lambda: ["ask_clarification"])  # applied after ``tools``
    model: str = "inherit"  # a name from ``models``, or ``inherit`` (the delegating agent's model)
    max_turns: Annotated[int, Field(ge=1)] = 50  # model turns, not graph steps
    timeout_s: Annotated[float, Field(gt=0)] | None = None  # None: subagents.timeout_s
    # How many further levels of delegation a subagent of this type may start (0: it has no
    # ``task`` tool); bounded by the delegating agent's own remaining depth.
    delegation_depth: Annotated[int, Field(ge=0, le=3)] = 0

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v or not all(c.isalnum() or c in "-_" for c in v) or len(v) > 64:
            raise ValueError(f"{v!r}: a type name is 1-64 letters, digits, '-' or '_'")
        return v


class SubagentsConfig(_Strict):
    """Delegation: how many subagents run, where, and for how long (``subagents:``)."""

    max_concurrent: Annotated[int, Field(ge=1, le=8)] = 3  # task calls run per model response
    max_per_run: Annotated[int, Field(ge=1, le=50)] = 6  # task calls per run, counted from the ledger
    process_capacity: Annotated[int, Field(ge=1, le=1024)] = 16  # subagents running at once per process; beyond: queued (FIFO)
    timeout_s: Annotated[float, Field(gt=0)] = 900.0  # a subagent's wall clock, from when it starts running
    types: list[SubagentTypeConfig] = Field(default_factory=list)
    # A subagent's compaction when ``limits.summarization`` is off (always on: it is mandatory).
    summarization: SubagentSummarizationLimits = Field(default_factory=SubagentSummarizationLimits)

    @model_validator(mode="after")
    def _unique(self) -> SubagentsConfig:
        names = [t.name for t in self.types]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"types: duplicate subagent type name(s) {duplicates}")
        return self

    def type_names(self) -> list[str]:
        names = [t.name for t in self.types]
        return names if GENERAL_PURPOSE in names else [GENERAL_PURPOSE, *names]

    def type(self, name: str) -> SubagentTypeConfig | None:
        found = next((t for t in self.types if t.name == name), None)
        if found is None and name == GENERAL_PURPOSE:
            return SubagentTypeConfig(name=GENERAL_PURPOSE, description="A general-purpose agent for a self-contained subtask.")
        return found


DatabaseUrlField = Annotated[DatabaseUrl, PlainValidator(as_database_url), PlainSerializer(str)]


class KeelConfig(_Strict):
    data_dir: str = "./.agentkeel"
    database: DatabaseUrlField | None = None  # parsed here, once; default: sqlite:///<data_dir>/keel.db
    database_pool: DatabasePool = Field(default_factory=DatabasePool)
    stream: str = "memory"  # or redis://host:port/db
    stream_prefix: str = "agentkeel"  # Redis key namespace, so deployments can share one Redis
    checkpoint_mode: Literal["full", "delta"] = "full"
    models: list[ModelConfig] = Field(default_factory=list)
    assistants: list[AssistantConfig] = Field(default_factory=list)
    graphs: dict[str, str] = Field(default_factory=dict)
    # Agent Skills: <skills_dir>/<name>/SKILL.md. Unset: ./skills if it exists, else no skills; a
    # directory named here must exist. (None rather than "./skills" so a dumped config reloads.)
    skills_dir: str | None = None
    limits: Limits = Field(default_factory=Limits)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    subagents: SubagentsConfig = Field(default_factory=SubagentsConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)

    # Where relative paths (scripts, graphs, data_dir, skills_dir) resolve; not a config key.
    base_dir: Path = Field(default_factory=Path.cwd, exclude=True)
    # The file this was loaded from (hidden from bash commands); not a config key.
    config_file: Path | None = Field(default=None, exclude=True)

    def model_post_init(self, _ctx: Any) -> None:
        if self.database is not None:
            self.database = self.database.resolved(self.base_dir)
        if not self.models:
            self.models = [ModelConfig(name="demo", use="scripted", script=str(BUNDLED_SCRIPTS / "demo.yaml"))]
        names = [m.name for m in self.models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"models: duplicate model name(s) {duplicates}")
        if not any(a.assistant_id == "lead" for a in self.assistants):
            self.assistants = [AssistantConfig(assistant_id="lead"), *self.assistants]
        for index, assistant in enumerate(self.assistants):
            if assistant.model is not None and assistant.model not in names:
                raise ValueError(
                    f"assistants.{index}.model: {assistant.model!r} is not in models {names}"
                )
        for key, summarization in (("limits", self.limits.summarization), ("subagents", self.subagents.summarization)):
            if summarization.model is not None and summarization.model not in names:
                raise ValueError(f"{key}.summarization.model: {summarization.model!r} is not in models {names}")
        for index, kind in enumerate(self.subagents.types):
            if kind.model != "inherit" and kind.model not in names:
                raise ValueError(
                    f"subagents.types.{index}.model: {kind.model!r} is neither 'inherit' nor in models {names}"
                )
        clash = sorted({a.assistant_id for a in self.assistants} & set(self.graphs))
        if clash:
            raise ValueError(f"graphs: name(s) {clash} clash with an assistant_id")
        if self.skills_dir is not None and not self.resolve_path(self.skills_dir).is_dir():
            raise ValueError(
                f"skills_dir: {self.skills_dir!r} is not a directory ({self.resolve_path(self.skills_dir)})"
            )

    # -- derived ---------------------------------------------------------------------------
    def resolve_path(self, value: str | Path) -> Path:
        path = Path(value).expanduser()
        return path if path.is_absolute() else (self.base_dir / path).resolve()

    @property
    def data_path(self) -> Path:
        return self.resolve_path(self.data_dir)

    @property
    def skills_path(self) -> Path | None:
        """The skills directory, or None when the default one (``./skills``) does not exist."""
        path = self.resolve_path(self.skills_dir or DEFAULT_SKILLS_DIR)
        return path if path.is_dir() else None

    def bash_sandbox(self) -> BashSandbox | None:
        """The confinement of every bash call; None when the deployment chose no sandbox."""
        tools = self.tools
        if tools.bash_unsandboxed:
            return None
        return BashSandbox(
            hidden=(
                self.data_path,
                *([self.config_file] if self.config_file is not None else []),
                *(self.resolve_path(p) for p in tools.bash_hide),
            ),
            network=tools.bash_network,
            cpu_s=tools.bash_cpu_s,
            memory_mb=tools.bash_memory_mb,
            max_processes=tools.bash_max_processes,
            max_file_mb=tools.bash_max_file_mb,
            root_uid=tools.bash_root_uid,
        )

    @property
    def database_url(self) -> DatabaseUrl:
        return self.database or DatabaseUrl("sqlite", str(self.data_path / "keel.db"))

    @property
    def db(self) -> Database:
        """What the connection layer opens: the database URL and the pool settings."""
        return Database(self.database_url, self.database_pool)

    def model(self, name: str) -> ModelConfig:
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(name)

    def assistant(self, assistant_id: str) -> AssistantConfig | None:
        return next((a for a in self.assistants if a.assistant_id == assistant_id), None)

    def default_model_for(self, assistant: AssistantConfig) -> str:
        return assistant.model or self.models[0].name


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key path."""


def _format(error: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"  {path}: {message}" if path else f"  {message}")
    return "\n".join(lines)


def load_config(path: str | Path | None = None, env: dict[str, str] | None = None) -> KeelConfig:
    """Load the YAML file (``path`` or ``$AGENTKEEL_CONFIG``), apply env overrides, validate."""
    env = dict(os.environ if env is None else env)
    path = path or env.get("AGENTKEEL_CONFIG") or None
    raw: Any = {}
    base_dir = Path.cwd()
    config_file: Path | None = None
    source = "<defaults>"
    if path:
        file = Path(path).expanduser()
        if not file.is_file():
            raise ConfigError(f"config file not found: {file}")
        try:
            raw = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {file} is not valid YAML: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {file}: the top level must be a mapping")
        config_file = file.resolve()
        base_dir = config_file.parent
        source = str(file)
    for internal in ("base_dir", "config_file"):
        if internal in raw:
            raise ConfigError(f"invalid configuration in {source}:\n  {internal}: Extra inputs are not permitted")
    if env.get("AGENTKEEL_DATABASE_URL"):
        raw["database"] = env["AGENTKEEL_DATABASE_URL"]
    if env.get("AGENTKEEL_REDIS_URL"):
        raw["stream"] = env["AGENTKEEL_REDIS_URL"]
    try:
        return KeelConfig(**raw, base_dir=base_dir, config_file=config_file)
    except ValidationError as exc:
        raise ConfigError(_format(exc, source)) from None
