from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from flowtrial.study.config import StudyConfig, example_study_text, parse_study


def make_config(**study: object) -> StudyConfig:
    data = tomllib.loads(example_study_text(study.get("design", "per_prompt")))  # type: ignore[arg-type]
    data["study"].update(study)
    return parse_study(data)


@pytest.fixture
def study_file(tmp_path: Path) -> Path:
    p = tmp_path / "study.toml"
    p.write_text(example_study_text())
    return p


@pytest.fixture
def parallel_file(tmp_path: Path) -> Path:
    text = example_study_text("parallel")
    p = tmp_path / "parallel.toml"
    p.write_text(text)
    return p
