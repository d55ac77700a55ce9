"""Which client sent a request: the agent's name without its version, and the SDK it used.

A User-Agent is a list of product tokens (``name/version (comment)``). Agents put their own
name first (``claude-cli/2.1.197 (external, cli)``, ``opencode/1.18.33 ai-sdk/provider-utils/
4.0.23 runtime/bun/1.3.14``), or send only their SDK's (aider through litellm:
``OpenAI/Python 2.20.0``; Cline and its forks: ``OpenAI/JS 4.x`` with an ``X-Title``).
:func:`client_identity` reads the tokens against the tables below: the **agent** is the
first known agent token (else the ``X-Title`` header's known agent, else the SDK's name,
else the first token's name), the **SDK** the first known SDK token, both lower-case and
without versions (docs/concepts/turns.md#classifying-every-request). The turn rules compare
agent names, so an agent that updates mid-study stays the same client.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["AGENTS", "SDKS", "ClientIdentity", "client_identity", "client_name"]

#: Product-token names (lower-cased, version dropped) → the agent's name.
AGENTS: dict[str, str] = {
    "claude-cli": "claude-cli", "claude-code": "claude-cli",
    "codex_exec": "codex", "codex_cli_rs": "codex", "codex_vscode": "codex",
    "codex-tui": "codex", "codex": "codex",
    "geminicli": "gemini-cli", "geminicli-tui": "gemini-cli", "gemini-cli": "gemini-cli",
    "opencode": "opencode",
    "aider": "aider",
    "qwencode": "qwen-code", "qwen-code": "qwen-code",
    "crush": "crush",
    "cline": "cline", "roocode": "roo-code", "roo-code": "roo-code", "kilo-code": "kilo-code",
    "githubcopilotchat": "copilot-chat",
    "zed": "zed",
    "goose": "goose",
    "continue": "continue",
    "cursor": "cursor",
    "amp": "amp",
}

#: Product-token names (lower-cased, version dropped; for ``a/b/1.0`` the first two parts)
#: → the SDK's name.
SDKS: dict[str, str] = {
    "openai/python": "openai/python", "asyncopenai/python": "openai/python",
    "openai/js": "openai/js", "openai/node": "openai/js",
    "anthropic/python": "anthropic/python", "asyncanthropic/python": "anthropic/python",
    "anthropic/js": "anthropic/js",
    "ai-sdk": "ai-sdk",
    "google-genai-sdk": "google-genai", "google-api-nodejs-client": "google-api-nodejs",
    "litellm": "litellm",
    "langchain": "langchain",
}

#: ``X-Title`` values (OpenRouter's app-name header, which VS Code agents send).
_TITLES: dict[str, str] = {"cline": "cline", "roo code": "roo-code", "kilo code": "kilo-code",
                           "aider": "aider", "continue": "continue"}

_VERSION = re.compile(r"^v?\d")


@dataclass(frozen=True)
class ClientIdentity:
    """The agent's name (``cycles.client``) and its SDK's (``cycles.client_sdk``)."""

    agent: str | None
    sdk: str | None


def _products(user_agent: str) -> list[str]:
    """Each product token's name without its version, lower-cased; comments skipped
    (``ai-sdk/provider-utils/4.0.23`` → ``ai-sdk/provider-utils``, ``OpenAI/Python 1.9`` →
    ``openai/python``)."""
    out: list[str] = []
    for word in re.sub(r"\([^)]*\)", " ", user_agent).split():
        parts = word.split("/")
        if _VERSION.match(parts[0]):
            continue  # the version of the token before (``OpenAI/Python 1.99``)
        out.append("/".join(p for p in parts if not _VERSION.match(p)).lower())
    return out


def _known(name: str, table: Mapping[str, str]) -> str | None:
    if name in table:
        return table[name]
    head = name.split("/")
    for n in (2, 1):
        if len(head) >= n and "/".join(head[:n]) in table:
            return table["/".join(head[:n])]
    return None


def client_identity(user_agent: str | None, headers: Mapping[str, str] | None = None
                    ) -> ClientIdentity:
    """The agent and SDK of a request from its User-Agent (and ``X-Title``,
    ``originator`` headers when given); see the module docstring."""
    headers = headers or {}
    products = _products(user_agent) if user_agent and user_agent.strip() else []
    agent = next((a for p in products if (a := _known(p, AGENTS)) is not None), None)
    sdk = next((s for p in products if (s := _known(p, SDKS)) is not None), None)
    if agent is None:
        for header in ("originator", "x-title"):
            value = (headers.get(header) or "").strip().lower()
            agent = AGENTS.get(value) or _TITLES.get(value)
            if agent is not None:
                break
    if agent is None:
        agent = sdk or (products[0][:64] if products else None)
    return ClientIdentity(agent=agent, sdk=sdk)


def client_name(user_agent: str | None) -> str | None:
    """The agent's name alone (see :func:`client_identity`)."""
    return client_identity(user_agent).agent
