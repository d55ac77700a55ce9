"""Where a result came from: the flowtrial version and the study configuration's hash
(:meth:`~flowtrial.study.config.StudyConfig.config_hash`), carried by ``results.json``, the
report and a release package (docs/researchers/field-study.md#7-release-the-data)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["flowtrial_version", "provenance"]


def flowtrial_version() -> str:
    try:
        return version("flowtrial")
    except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
        return "unknown"


def provenance(config: Any) -> dict[str, str]:
    """``{"flowtrial_version", "config_hash"}`` of a study configuration."""
    return {"flowtrial_version": flowtrial_version(), "config_hash": config.config_hash()}
