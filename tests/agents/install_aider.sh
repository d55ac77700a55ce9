#!/usr/bin/env bash
# Installs aider (pinned) in a virtual environment of its own, .aider-venv at the repository
# root (hidden and git-ignored, so neither pytest nor the docs checks walk into it): aider
# pins many packages (litellm, openai, tokenizers …) that would clash with flowtrial's own.
# tests/agents/test_agent_turns_more.py runs .aider-venv/bin/aider and skips when it is
# absent. Idempotent: does nothing when the pinned version is installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
AIDER_VERSION="0.86.2"
venv=".aider-venv"
installed=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('aider-chat'))" \
  2>/dev/null || true)
if [ -x "$venv/bin/aider" ] && [ "$installed" = "$AIDER_VERSION" ]; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "aider-chat==$AIDER_VERSION"
