"""How the real agents are pointed at flowtrial: one source for the tests and the
client recipes (docs/clients/); `opencode_config` is the recipe in docs/clients/opencode.md,
`aider_metadata` the model metadata file in docs/clients/aider.md.

`codex_config` is the Codex CLI `config.toml` (tests/agents/test_recipes.py checks that the
recipe in docs/clients/codex.md is the same); `claude_env` the Claude Code environment.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = [
    "CODEX_PROVIDER_ID",
    "KEY_ENV",
    "MODEL",
    "OTLP_PATH",
    "claude_env",
    "claude_telemetry_env",
    "codex_config",
    "codex_otel",
    "codex_provider",
    "gemini_env",
    "gemini_settings",
    "gemini_telemetry",
    "isolated_env",
    "to_toml",
]

CODEX_PROVIDER_ID = "flowtrial"
KEY_ENV = "FLOWTRIAL_API_KEY"  # the variable holding the participant key (Codex `env_key`)
MODEL = "flowtrial-sim-1"  # the built-in simulated model answers to any name; this is its own


def codex_provider(base_url: str, *, websockets: bool = False,
                   env_key: str = KEY_ENV) -> dict[str, Any]:
    """The `[model_providers.flowtrial]` table for an OpenAI base URL ending in `/v1`.

    `supports_websockets` decides the transport: true makes Codex open the Responses
    WebSocket mode (`ws://…/v1/responses`), false keeps it on HTTP + SSE.
    """
    return {
        "name": "flowtrial",
        "base_url": base_url,
        "wire_api": "responses",
        "env_key": env_key,
        "supports_websockets": websockets,
    }


def codex_config(base_url: str, *, websockets: bool = False, model: str = MODEL,
                 env_key: str = KEY_ENV) -> dict[str, Any]:
    """A whole Codex `config.toml` (as a dict) that talks to `base_url` and nothing else."""
    return {
        "model": model,
        "model_provider": CODEX_PROVIDER_ID,
        "model_providers": {
            CODEX_PROVIDER_ID: codex_provider(base_url, websockets=websockets, env_key=env_key),
        },
        # Offline: analytics would post OTLP metrics to ab.chatgpt.com, and the plugin
        # marketplace sync contacts chatgpt.com, github.com and api.github.com. Requests
        # uncompressed (zstd under a ChatGPT sign-in: the proxy answers 415).
        "analytics": {"enabled": False},
        "features": {"plugins": False, "enable_request_compression": False},
    }


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def to_toml(config: dict[str, Any], _prefix: str = "") -> str:
    """Write a config dict as TOML (scalars and lists, nested tables; enough for configs)."""
    scalars = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in config.items()
               if not isinstance(v, dict)]
    out = "\n".join(scalars) + ("\n" if scalars else "")
    for key, value in config.items():
        if isinstance(value, dict):
            name = f"{_prefix}{_toml_key(key)}"
            # A table holding only subtables needs no header of its own.
            if any(not isinstance(v, dict) for v in value.values()) or not value:
                out += f"\n[{name}]\n"
            out += to_toml(value, name + ".")
    return out


def isolated_env(home: Path) -> dict[str, str]:
    """A minimal environment with HOME and the XDG folders under `home`, so neither the
    user's config nor their keys (OPENAI_API_KEY, ANTHROPIC_API_KEY ...) leak in."""
    import os

    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
    }
    for folder in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        Path(env[folder]).mkdir(parents=True, exist_ok=True)
    return env


def claude_env(base_url: str, key: str) -> dict[str, str]:
    """Claude Code's variables for flowtrial: base URL without `/v1` (it appends
    `/v1/messages`), the participant key, and no traffic beyond the model calls."""
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": key,
        # Implies DISABLE_AUTOUPDATER, DISABLE_TELEMETRY, DISABLE_ERROR_REPORTING and
        # DISABLE_BUG_COMMAND; without it Claude Code contacts api.anthropic.com itself.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }


OTLP_PATH = "/flowtrial/otlp"  # the proxy's OTLP/HTTP receiver (exporters add /v1/<signal>)


def claude_telemetry_env(base_url: str, key: str, *, protocol: str = "http/protobuf",
                         fast: bool = True) -> dict[str, str]:
    """Claude Code's OpenTelemetry settings (the recipe in docs/clients/telemetry.md): logs,
    metrics and the beta spans to the proxy's receiver only, the participant key as the
    OTLP header. ``fast``: export every second (tests), not every 5 s / 60 s."""
    env = {
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA": "1",
        "OTEL_LOGS_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_ENDPOINT": base_url + OTLP_PATH,
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer {key}",
    }
    if fast:
        env |= {"OTEL_LOGS_EXPORT_INTERVAL": "1000", "OTEL_METRIC_EXPORT_INTERVAL": "1000"}
    return env


def codex_otel(base_url: str, key: str, *, protocol: str = "json") -> dict[str, Any]:
    """Codex's `[otel]` table: log events over OTLP/HTTP (`protocol` = "json" | "binary") to
    the proxy's receiver only; prompts redacted (`log_user_prompt = false`)."""
    return {
        "log_user_prompt": False,
        "exporter": {"otlp-http": {
            "endpoint": base_url + OTLP_PATH + "/v1/logs",
            "protocol": protocol,
            "headers": {"authorization": f"Bearer {key}"},
        }},
    }


def codex_notify(base_url: str, program: tuple[str, ...] = ("flowtrial",)) -> list[str]:
    """Codex's `notify` program: `flowtrial codex-notify` posting each turn's end to the
    proxy at `base_url` (the participant key from FLOWTRIAL_API_KEY, Codex's env_key)."""
    return [*program, "codex-notify", "--url", base_url]


def gemini_env(base_url: str, key: str) -> dict[str, str]:
    """Gemini CLI's variables for flowtrial: the proxy's root URL (it appends
    ``/v1beta/models/<model>:streamGenerateContent?alt=sse``), the participant key as the
    Gemini API key, and headless trust of the project folder."""
    return {
        "GOOGLE_GEMINI_BASE_URL": base_url,
        "GEMINI_API_KEY": key,
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
    }


def gemini_settings(base_url: str | None = None) -> dict[str, Any]:
    """Gemini CLI's ``~/.gemini/settings.json``: the API-key auth (the base URL comes from
    GOOGLE_GEMINI_BASE_URL), no update check, no usage statistics to Google; with
    ``base_url``, its telemetry to the proxy's receiver (:func:`gemini_telemetry`)."""
    return {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": gemini_telemetry(base_url) if base_url else {"enabled": False},
    }


def gemini_telemetry(base_url: str) -> dict[str, Any]:
    """Gemini CLI's `telemetry` settings (settings.json) for the proxy's receiver; its HTTP
    exporters take the key from OTEL_EXPORTER_OTLP_HEADERS (the OpenTelemetry JS variable)."""
    return {
        "enabled": True,
        "target": "local",
        "otlpEndpoint": base_url + OTLP_PATH,
        "otlpProtocol": "http",
        "logPrompts": False,
    }


OPENCODE_PROVIDER_ID = "flowtrial"


def opencode_config(base_url: str, key: str, model: str = MODEL) -> dict[str, Any]:
    """opencode's config (`opencode.json`, or OPENCODE_CONFIG_CONTENT): a custom provider on
    the OpenAI-compatible API at ``base_url`` (ending in `/v1`), nothing shared, no updates."""
    return {
        "model": f"{OPENCODE_PROVIDER_ID}/{model}",
        "small_model": f"{OPENCODE_PROVIDER_ID}/{model}",
        "autoupdate": False,
        "share": "disabled",
        "provider": {OPENCODE_PROVIDER_ID: {
            "npm": "@ai-sdk/openai-compatible",
            "name": "flowtrial",
            "options": {"baseURL": base_url, "apiKey": key},
            "models": {model: {"name": model, "tool_call": True}},
        }},
    }


def opencode_env(base_url: str, key: str) -> dict[str, str]:
    """opencode's variables: the config above, and no traffic beyond the model calls (no
    models.dev catalog, update check, LSP or plugin downloads, sharing, Claude Code files)."""
    return {
        "OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(base_url, key)),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
    }


def opencode_offline_home(config_home: Path) -> None:
    """Mark opencode's config folder's plugin package as installed: opencode installs
    `@opencode-ai/plugin` there from the npm registry at start unless its `node_modules`
    exists and its lock file lists the package (its Npm.install skips a folder then)."""
    folder = config_home / "opencode"
    (folder / "node_modules").mkdir(parents=True, exist_ok=True)
    (folder / "package.json").write_text("{}\n")
    (folder / "package-lock.json").write_text(json.dumps({"lockfileVersion": 3, "packages": {
        "": {"dependencies": {"@opencode-ai/plugin": "*"}}}}) + "\n")


def aider_metadata(model: str = MODEL) -> dict[str, Any]:
    """aider's `--model-metadata-file` for the simulated model: with the model's entry
    there, aider does not download litellm's model list from GitHub."""
    return {f"openai/{model}": {"max_input_tokens": 128000, "max_output_tokens": 8192,
                                "input_cost_per_token": 0, "output_cost_per_token": 0,
                                "litellm_provider": "openai", "mode": "chat"}}


def aider_args(metadata_file: Path, model: str = MODEL) -> list[str]:
    """aider's options for flowtrial (OPENAI_API_BASE / OPENAI_API_KEY in the environment):
    no git, no update or release-notes check, no analytics, the model's metadata local."""
    return ["--model", f"openai/{model}", "--model-metadata-file", str(metadata_file),
            "--no-git", "--yes-always", "--no-check-update", "--analytics-disable",
            "--no-show-model-warnings", "--no-show-release-notes", "--no-pretty",
            "--edit-format", "whole"]
