"""The composition root's tests use the study package's fixtures (study files)."""

from ..study.conftest import make_config, parallel_file, study_file

__all__ = ["make_config", "parallel_file", "study_file"]
