"""The table of optional dependencies (study/extras.py) against pyproject.toml, and its
detection of a missing package (the README's first command crashed on a dotted find_spec)."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from flowtrial.study import extras
from flowtrial.study.errors import FlowtrialError

ROOT = Path(__file__).resolve().parents[2]
NOT_FEATURES = {"all", "docs", "test"}  # bundles and development extras, not features


def _distributions(extra: str, table: dict[str, list[str]]) -> set[str]:
    """The distributions an extra installs, through its `flowtrial[...]` inclusions."""
    out: set[str] = set()
    for requirement in table[extra]:
        name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]
        if name == "flowtrial":
            for inner in re.findall(r"\[(.*)\]", requirement)[0].split(","):
                out |= _distributions(inner.strip(), table)
        else:
            out.add(re.sub(r"[-_.]+", "-", name).lower())
    return out


def test_every_feature_extra_is_in_the_table_and_provides_what_it_lists() -> None:
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert set(table) - NOT_FEATURES == set(extras.EXTRAS)
    owners = {top: {re.sub(r"[-_.]+", "-", d).lower() for d in dists}
              for top, dists in packages_distributions().items()}
    for extra, modules in extras.EXTRAS.items():
        installs = _distributions(extra, table)
        provided = set().union(*(owners.get(m.split(".")[0], set()) for m in modules))
        # every distribution of the extra is seen through one of its import names ...
        assert installs <= provided, (extra, installs - provided)
        # ... and every import name comes from one of its distributions
        for module in modules:
            assert owners.get(module.split(".")[0], set()) & installs, (extra, module)


def test_a_dotted_name_whose_parent_is_missing_is_missing_not_an_error() -> None:
    assert extras._installed("flowtrial_no_such_parent.proto") is False
    assert extras._installed("json.decoder") is True
    assert extras._installed("json.no_such_child") is False


def test_require_names_the_extra_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(extras.EXTRAS, "telemetry", ("flowtrial_absent.proto", "json"))
    assert extras.missing("telemetry") == ["flowtrial_absent.proto"]
    assert not extras.available("telemetry")
    with pytest.raises(FlowtrialError) as caught:
        extras.require("telemetry", "flowtrial import-otel")
    assert str(caught.value) == (
        "flowtrial import-otel needs the [telemetry] extra (flowtrial_absent.proto is not "
        "installed): pip install 'flowtrial[telemetry]'")
    extras.require("proxy", "flowtrial proxy")  # the test environment has every extra


def test_extra_of_module_is_the_smallest_extra_providing_it() -> None:
    assert extras.extra_of_module("streamlit") == "dashboard"
    assert extras.extra_of_module("jinja2") == "analysis"
    assert extras.extra_of_module("opentelemetry") == "telemetry"
    assert extras.extra_of_module("google.protobuf.message") == "telemetry"
    assert extras.extra_of_module("nonsense") is None
