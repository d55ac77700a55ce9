"""The client recipes (docs/clients/*.md, one page per client): every config snippet parses,
and the Codex, Claude Code, opencode and aider recipes are the configurations the real-agent
tests run with (tests/agents/agent_configs.py)."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.agents.agent_configs import (
    aider_metadata,
    claude_env,
    codex_config,
    opencode_config,
    opencode_env,
    to_toml,
)

CLIENTS = Path(__file__).resolve().parents[2] / "docs" / "clients"


def _pages() -> dict[str, str]:
    """Each recipe page's text by its title (the page's `# ` heading); index.md is no recipe."""
    out = {}
    for page in sorted(CLIENTS.glob("*.md")):
        if page.name == "index.md":
            continue
        text = page.read_text(encoding="utf-8")
        title = re.match(r"# (.+)", text)
        assert title, f"{page} has no '# ' title"
        out[title.group(1).strip()] = text
    return out
PROXY = "http://127.0.0.1:8787"  # the proxy's default address
OPENAI_BASE = PROXY + "/v1"
KEY = "ft_your_participant_key"  # the placeholder the recipes use for the participant key
PARSERS: dict[str, Callable[[str], Any]] = {
    "toml": tomllib.loads,
    "yaml": yaml.safe_load,
    "json": json.loads,
}
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def _sections() -> dict[str, list[tuple[str, str]]]:
    """Fenced blocks (language tag, text) per client recipe page."""
    return {title: [(m.group(1).strip(), m.group(2)) for m in _FENCE.finditer(text)]
            for title, text in _pages().items()}


def _blocks(section: str, language: str) -> list[Any]:
    """The parsed blocks of one language in one section."""
    found = [text for lang, text in _sections()[section] if lang == language]
    assert found, f"the client recipe page {section!r} has no {language} block"
    return [PARSERS[language](text) if language in PARSERS else text for text in found]


def _exports(script: str) -> dict[str, str]:
    return dict(re.findall(r"^export (\w+)=(\S+)", script, flags=re.MULTILINE))


def test_every_block_is_tagged_and_every_config_block_parses() -> None:
    sections = _sections()
    assert {"Continue", "Aider", "Codex CLI", "Cline", "Zed", "Claude Code"} <= set(sections)
    blocks = [block for section in sections.values() for block in section]
    assert all(lang for lang, _ in blocks), "every fenced block needs a language tag"
    parsed = [(lang, PARSERS[lang](text)) for lang, text in blocks if lang in PARSERS]
    assert {lang for lang, _ in parsed} == set(PARSERS)
    assert all(isinstance(value, dict) and value for _, value in parsed)


def test_codex_recipe_is_the_config_the_agent_tests_write() -> None:
    (recipe,) = _blocks("Codex CLI", "toml")
    assert recipe == codex_config(OPENAI_BASE, websockets=False)
    (script,) = _blocks("Codex CLI", "bash")
    env_key = recipe["model_providers"][recipe["model_provider"]]["env_key"]
    assert _exports(script) == {env_key: KEY}


@pytest.mark.parametrize("websockets", [False, True])
def test_the_written_codex_config_reads_back_the_same(websockets: bool) -> None:
    config = codex_config("http://127.0.0.1:1234/v1", websockets=websockets)
    assert tomllib.loads(to_toml(config)) == config


def test_claude_code_recipes_are_the_tested_environment() -> None:
    expected = claude_env(PROXY, KEY)
    (script,) = _blocks("Claude Code", "bash")
    assert _exports(script) == expected
    (settings,) = _blocks("Claude Code", "json")
    assert settings == {"env": expected}


def test_openai_style_recipes_point_at_the_proxy_with_the_participant_key() -> None:
    (continue_config,) = _blocks("Continue", "yaml")
    (model,) = continue_config["models"]
    assert (model["provider"], model["apiBase"], model["apiKey"]) == ("openai", OPENAI_BASE, KEY)
    assert "chat" in model["roles"]

    (aider_conf,) = _blocks("Aider", "yaml")
    assert aider_conf["openai-api-base"] == OPENAI_BASE and aider_conf["openai-api-key"] == KEY
    assert aider_conf["model"].startswith("openai/")
    (aider_script,) = _blocks("Aider", "bash")
    assert _exports(aider_script) == {"OPENAI_API_BASE": OPENAI_BASE, "OPENAI_API_KEY": KEY}

    (zed,) = _blocks("Zed", "json")
    provider = zed["language_models"]["openai_compatible"]["flowtrial"]
    assert provider["api_url"] == OPENAI_BASE and provider["available_models"][0]["name"]

    cline = _pages()["Cline"]
    assert f"`{OPENAI_BASE}`" in cline and f"`{KEY}`" in cline


def test_every_address_in_the_recipes_is_the_local_proxy() -> None:
    texts = [text for section in _sections().values() for _, text in section]
    urls = re.findall(r"(?:https?|wss?)://[^\s\"'`)]+", "\n".join(texts))
    assert urls and all(urlsplit(url).netloc == urlsplit(PROXY).netloc for url in urls), urls


def test_opencode_and_aider_recipes_are_the_tested_configurations() -> None:
    (config,) = _blocks("opencode", "json")
    assert config == opencode_config(OPENAI_BASE, KEY)
    (script,) = _blocks("opencode", "bash")
    assert _exports(script) == {k: v for k, v in opencode_env(OPENAI_BASE, KEY).items()
                                if k != "OPENCODE_CONFIG_CONTENT"}
    (metadata,) = _blocks("Aider", "json")
    assert metadata == aider_metadata()
