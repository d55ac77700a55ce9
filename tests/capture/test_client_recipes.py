"""One source for a participant's assistant settings: the recipes module, the recipe pages in
docs/clients/, the participant page and `flowtrial onboard` all agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flowtrial.cli import app
from flowtrial.instrumentation.client_recipes import DOC_BASE, DOC_KEY, RECIPES, render

CLIENTS = Path(__file__).resolve().parents[2] / "docs" / "clients"
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_snippet_is_a_block_of_its_recipe_page(name: str) -> None:
    r = RECIPES[name]
    text = (CLIENTS / r.page).read_text(encoding="utf-8")
    assert text.startswith(f"# {r.title}\n")
    blocks = [(m.group(1).strip(), m.group(2)) for m in _FENCE.finditer(text)]
    for s in r.snippets:
        assert (s.lang, s.text) in blocks, f"{r.page} lacks the {s.lang} block of {name}"


def test_render_fills_in_key_and_address() -> None:
    key = "ft_abc123_secret"
    (toml, bash) = render(RECIPES["codex"], key=key, base_url="https://trial.example.org/")
    cfg = tomllib.loads(toml.text)
    assert cfg["model_providers"]["flowtrial"]["base_url"] == "https://trial.example.org/v1"
    assert "wss://trial.example.org/v1/responses" in toml.text
    assert f"export FLOWTRIAL_API_KEY={key}" in bash.text
    for r in RECIPES.values():
        for s in render(r, key=key, base_url="http://10.0.0.5:9000"):
            assert DOC_KEY not in s.text and DOC_BASE not in s.text


def _study(tmp_path: Path) -> Path:
    p = tmp_path / "study.toml"
    p.write_text('[study]\nname = "field"\ndesign = "parallel"\n[[arms]]\nname = "a"\n'
                 '[proxy]\npublic_url = "https://trial.example.org"\n', encoding="utf-8")
    return p


def test_onboard_prints_the_page_settings(tmp_path: Path, monkeypatch: Any) -> None:
    study = _study(tmp_path)
    db = tmp_path / "study.db"
    runner = CliRunner()
    out = runner.invoke(app, ["enroll", "--study", str(study), "--db", str(db),
                              "--participant", "p01"])
    assert out.exit_code == 0, out.output
    key = out.output.strip().splitlines()[-1]
    monkeypatch.setenv("FLOWTRIAL_KEY", key)
    out = runner.invoke(app, ["onboard", "--study", str(study), "--db", str(db),
                              "--participant", "p01", "--client", "claude-code"])
    assert out.exit_code == 0, out.output
    for s in render(RECIPES["claude-code"], key=key, base_url="https://trial.example.org"):
        assert s.text in out.output
    monkeypatch.setenv("FLOWTRIAL_KEY", key[:-2] + "zz")
    bad = runner.invoke(app, ["onboard", "--study", str(study), "--db", str(db),
                              "--participant", "p01", "--client", "codex"])
    assert bad.exit_code == 2 and "is not p01's key" in bad.output
    monkeypatch.delenv("FLOWTRIAL_KEY")
    placeholder = runner.invoke(app, ["onboard", "--study", str(study), "--participant",
                                      "p01", "--client", "aider"])
    assert placeholder.exit_code == 0 and DOC_KEY in placeholder.output
    unknown = runner.invoke(app, ["onboard", "--study", str(study), "--participant", "p01",
                                  "--client", "emacs"])
    assert unknown.exit_code == 2 and "use one of" in unknown.output
