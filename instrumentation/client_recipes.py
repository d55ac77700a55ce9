'''The client recipes: ready-to-paste settings per supported assistant — the one source of
the settings the participant page shows after login, ``flowtrial onboard`` prints, and the
configuration blocks of the recipe pages in ``docs/clients/`` (``tests/capture/
test_client_recipes.py`` checks that every snippet here appears verbatim on its page).

Snippets are written as the docs write them: the proxy at ``http://127.0.0.1:8787`` and the
key ``ft_your_participant_key``; :func:`render` puts in a participant's own. Adding a client
is one :class:`ClientRecipe` entry in :data:`RECIPES` (and its page).
'''

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DOC_BASE", "DOC_KEY", "RECIPES", "ClientRecipe", "Snippet", "recipe", "render"]

DOC_BASE = "http://127.0.0.1:8787"  # the proxy's address as the recipe pages write it
DOC_KEY = "ft_your_participant_key"  # the key placeholder of the recipe pages


@dataclass(frozen=True)
class Snippet:
    lang: str  # the fenced block's language tag (bash, toml, json, yaml)
    where: str  # where it goes, shown above it
    text: str


@dataclass(frozen=True)
class ClientRecipe:
    name: str  # the --client name
    title: str  # the page's title
    page: str  # its page in docs/clients/
    snippets: tuple[Snippet, ...]


def _r(name: str, title: str, page: str, *snippets: tuple[str, str, str]) -> ClientRecipe:
    return ClientRecipe(name, title, page, tuple(Snippet(*s) for s in snippets))


RECIPES: dict[str, ClientRecipe] = {r.name: r for r in (
    _r("codex", "Codex CLI", "codex.md",
       ("toml", "~/.codex/config.toml (or $CODEX_HOME/config.toml)", '''\
model = "flowtrial-sim-1"
model_provider = "flowtrial"

[model_providers.flowtrial]
name = "flowtrial"
base_url = "http://127.0.0.1:8787/v1"
wire_api = "responses"
env_key = "FLOWTRIAL_API_KEY"
# true: Codex uses the Responses WebSocket mode (ws://127.0.0.1:8787/v1/responses).
# A server that refuses the handshake costs ~7 s of retries before Codex falls back to SSE.
supports_websockets = false

# Keep Codex to the proxy: no usage analytics (sent to ab.chatgpt.com) and no plugin
# marketplace sync (chatgpt.com, github.com). Requests uncompressed: signed in with
# ChatGPT, Codex may send them zstd-compressed, which the proxy cannot read (415).
[analytics]
enabled = false

[features]
plugins = false
enable_request_compression = false
'''),
       ("bash", "your shell (e.g. ~/.bashrc), then run codex", '''\
export FLOWTRIAL_API_KEY=ft_your_participant_key
codex                                   # interactive; or non-interactive:
codex exec --skip-git-repo-check "Add a --verbose flag to cli.py"
''')),
    _r("claude-code", "Claude Code", "claude-code.md",
       ("bash", "your shell (e.g. ~/.bashrc), then run claude", '''\
export ANTHROPIC_BASE_URL=http://127.0.0.1:8787
export ANTHROPIC_API_KEY=ft_your_participant_key
export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1
export DISABLE_AUTOUPDATER=1
export DISABLE_TELEMETRY=1
export DISABLE_ERROR_REPORTING=1
claude --model flowtrial-sim-1          # interactive; or non-interactive: claude -p "…"
'''),
       ("json", "or ~/.claude/settings.json", '''\
{
  "env": {
    "ANTHROPIC_BASE_URL": "http://127.0.0.1:8787",
    "ANTHROPIC_API_KEY": "ft_your_participant_key",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1"
  }
}
''')),
    _r("aider", "Aider", "aider.md",
       ("bash", "your shell, then run aider", '''\
export OPENAI_API_BASE=http://127.0.0.1:8787/v1
export OPENAI_API_KEY=ft_your_participant_key
aider --model openai/flowtrial-sim-1
'''),
       ("yaml", "or .aider.conf.yml in your home folder or the repository", '''\
openai-api-base: http://127.0.0.1:8787/v1
openai-api-key: ft_your_participant_key
model: openai/flowtrial-sim-1
show-model-warnings: false  # aider has no metadata for the study's model name
analytics: false
check-update: false
''')),
    _r("gemini-cli", "Gemini CLI", "gemini-cli.md",
       ("bash", "your shell (e.g. ~/.bashrc), then run gemini", '''\
export GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:8787
export GEMINI_API_KEY=ft_your_participant_key
export GEMINI_CLI_TRUST_WORKSPACE=true
gemini -m flowtrial-sim-1          # interactive; or non-interactive: gemini -p "…" -m …
'''),
       ("json", "~/.gemini/settings.json", '''\
{
  "security": {"auth": {"selectedType": "gemini-api-key"}},
  "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
  "privacy": {"usageStatisticsEnabled": false},
  "telemetry": {"enabled": false}
}
''')),
    _r("opencode", "opencode", "opencode.md",
       ("json", "opencode.json in the project (or ~/.config/opencode/opencode.json)",
        '''\
{
  "model": "flowtrial/flowtrial-sim-1",
  "small_model": "flowtrial/flowtrial-sim-1",
  "autoupdate": false,
  "share": "disabled",
  "provider": {
    "flowtrial": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "flowtrial",
      "options": {
        "baseURL": "http://127.0.0.1:8787/v1",
        "apiKey": "ft_your_participant_key"
      },
      "models": {
        "flowtrial-sim-1": {"name": "flowtrial-sim-1", "tool_call": true}
      }
    }
  }
}
'''),
       ("bash", "your shell, then run opencode", '''\
export OPENCODE_DISABLE_MODELS_FETCH=1
export OPENCODE_DISABLE_AUTOUPDATE=1
export OPENCODE_DISABLE_LSP_DOWNLOAD=1
export OPENCODE_DISABLE_DEFAULT_PLUGINS=1
export OPENCODE_DISABLE_SHARE=1
export OPENCODE_DISABLE_CLAUDE_CODE=1
export OPENCODE_DISABLE_EXTERNAL_SKILLS=1
opencode
''')),
    _r("continue", "Continue", "continue.md",
       ("yaml", "~/.continue/config.yaml (or a workspace .continue/config.yaml)",
        '''\
name: flowtrial study
version: 1.0.0
schema: v1
models:
  - name: flowtrial
    provider: openai
    model: flowtrial-sim-1
    apiBase: http://127.0.0.1:8787/v1
    apiKey: ft_your_participant_key
    roles:
      - chat
      - edit
      - apply
      - autocomplete
''')),
)}


def recipe(name: str) -> ClientRecipe:
    """The recipe of ``name``; KeyError names the known clients."""
    try:
        return RECIPES[name]
    except KeyError:
        raise KeyError(f"no recipe for client {name!r}: use one of "
                       f"{', '.join(sorted(RECIPES))}") from None


def render(r: ClientRecipe, *, key: str, base_url: str) -> list[Snippet]:
    """The recipe's snippets with the participant's key and the proxy's address put in."""
    base = base_url.rstrip("/")
    ws = base.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    out = []
    for s in r.snippets:
        text = (s.text.replace("ws://127.0.0.1:8787", ws).replace(DOC_BASE, base)
                .replace(DOC_KEY, key))
        out.append(Snippet(s.lang, s.where, text))
    return out
