"""Study-file validation: every documented error message, and the example file."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from flowtrial.study.config import ConfigError, example_study_text, load_study, parse_study


def switched_arms() -> list[dict]:
    """The example's commented ``[[arms]]`` tables, uncommented as its comment says to do
    when switching to a parallel or crossover design."""
    lines = example_study_text().splitlines()
    start = lines.index("# [[arms]]")
    end = lines.index("[capture]")
    block = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in lines[start:end]]
    return tomllib.loads("\n".join(block))["arms"]


def base() -> dict:
    """The example with its two arms uncommented (the error tests name arm keys)."""
    return tomllib.loads(example_study_text()) | {"arms": switched_arms()}


def problems(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_study(data)
    return exc.value.problems


def test_example_is_valid() -> None:
    cfg = parse_study(tomllib.loads(example_study_text()))
    assert cfg.study.design == "per_prompt"
    assert cfg.study.unit == "prompt"
    assert cfg.per_prompt is not None and cfg.per_prompt.ttft_ms is not None
    assert cfg.per_prompt.ttft_ms.scale == "log"
    assert cfg.capture.content == "fingerprint"
    assert cfg.capture.switch_min_away_s == 10
    assert cfg.arms == [] and cfg.allocated_arms == []  # a per-prompt study has no arms


def test_switching_the_example_to_parallel_as_its_comment_says() -> None:
    d = tomllib.loads(example_study_text())
    d["study"].update(design="parallel", unit="participant")
    d.pop("per_prompt")
    d["arms"] = switched_arms()
    cfg = parse_study(d)
    assert [a.name for a in cfg.allocated_arms] == ["fast", "slow"]
    assert cfg.arm("slow").ttft_ms == 8000


def test_negative_rate_names_the_key() -> None:
    d = base()
    d["arms"][1]["tokens_per_second"] = 0
    assert problems(d) == ["arms[1].tokens_per_second: must be > 0"]


def test_every_problem_is_listed_at_once() -> None:
    d = base()
    d["arms"][0]["ttft_ms"] = -5
    d["arms"][1]["delivery"] = "fast"
    d["capture"]["content"] = "everything"
    d["study"]["time_scale"] = 0
    lines = problems(d)
    assert "arms[0].ttft_ms: must be >= 0" in lines
    assert "arms[1].delivery: must be one of 'stream' or 'all_at_once'" in lines
    assert "capture.content: must be one of 'none', 'fingerprint' or 'full'" in lines
    assert "study.time_scale: must be > 0" in lines
    assert len(lines) == 4


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["study"].pop("name"), "study.name: is required"),
        (lambda d: d["study"].update(seed="x"), "study.seed: must be a whole number"),
        (lambda d: d["study"].update(design="latin"),
         "study.design: must be one of 'parallel', 'crossover', 'per_prompt' or 'observe'"),
        (lambda d: d["study"].update(unit="participant"),
         "study: unit 'participant' does not fit design 'per_prompt': use 'prompt'"),
        (lambda d: d["arms"][0].update(tokens_per_secnd=5),
         "arms[0].tokens_per_secnd: unknown key (check its spelling against `flowtrial init`'s "
         "example)"),
        (lambda d: d["arms"][0].update(name="fast arm"),
         "arms[0].name: may contain only letters, digits, '_', '.' and '-'"),
        (lambda d: d["arms"][1].update(name="fast"),
         "arms: duplicate arm name 'fast': names must be unique"),
        (lambda d: d.pop("per_prompt"),
         "per_prompt: design 'per_prompt' needs [per_prompt] with ttft_ms and/or "
         "tokens_per_second ranges"),
        (lambda d: d["per_prompt"].update(ttft_ms={"min": 500, "max": 100}),
         "per_prompt.ttft_ms: max must be >= min"),
        (lambda d: d["per_prompt"].update(ttft_ms={"min": 0, "max": 100}),
         "per_prompt.ttft_ms.min: must be > 0"),
        (lambda d: d["upstream"].update(kind="openai"),
         "upstream: kind 'openai' needs base_url (and api_key_env)"),
        (lambda d: d["upstream"].update(kind="openai", base_url="https://x/v1"),
         "upstream: kind 'openai' needs api_key_env (the name of the variable holding the "
         "study's key), or credentials = \"participant\" to forward each participant's own"),
        (lambda d: d["upstream"].update(kind="openai", base_url="ftp://x", api_key_env="K"),
         "upstream: base_url must start with http:// or https://"),
        (lambda d: d["upstream"].update(
            kind="openai", base_url="https://x/v1", api_key_env="sk-proj-abcdef123"),
         "upstream: api_key_env looks like a key itself: put the *name* of the environment "
         "variable that holds the key (e.g. OPENAI_API_KEY), never the key"),
        (lambda d: d["upstream"].update(
            kind="openai", base_url="https://x/v1", api_key_env="my key"),
         "upstream: api_key_env must be an environment variable name like OPENAI_API_KEY"),
        (lambda d: d["upstream"].update(kind="vertex"),
         "upstream.kind: must be one of 'mock', 'openai', 'anthropic' or 'gemini'"),
        (lambda d: d["upstream"].update(kind="gemini"),
         "upstream: kind 'gemini' needs base_url (and api_key_env)"),
        (lambda d: d["capture"].update(switch_min_away_s=0),
         "capture.switch_min_away_s: must be > 0"),
        (lambda d: d["proxy"].update(port=70000), "proxy.port: must be <= 65535"),
        (lambda d: d.update(arms={"name": "x"}), "arms: must be a list"),
    ],
)
def test_documented_error_messages(mutate, expected: str) -> None:
    d = base()
    mutate(d)
    assert problems(d) == [expected]


def test_design_needs_arms() -> None:
    d = base()
    d["study"].update(design="parallel", unit="participant")
    d["arms"] = []
    assert problems(d) == ["arms: design 'parallel' needs at least one [[arms]] table"]
    d["study"].update(design="crossover", unit="task")
    d["arms"] = [{"name": "a"}]
    assert problems(d) == ["arms: design 'crossover' needs at least two [[arms]] tables"]


def test_unit_defaults_from_design() -> None:
    d = base()
    d["study"].pop("unit")
    d["study"]["design"] = "crossover"
    assert parse_study(d).study.unit == "task"


def test_unshaped_arm_is_team_mode() -> None:
    d = base()
    d["study"].update(design="parallel", unit="participant")
    d["arms"] = [{"name": "team"}]
    cfg = parse_study(d)
    assert cfg.arms[0].shaped is False
    assert cfg.arm("team").name == "team"


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found: create one with `flowtrial init`"):
        load_study(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[study\nname=1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_study(bad)


def test_randomization_fingerprint_ignores_capture() -> None:
    a = parse_study(base())
    d = base()
    d["capture"]["content"] = "full"
    assert parse_study(d).randomization_fingerprint() == a.randomization_fingerprint()
    d["study"]["seed"] = 1
    assert parse_study(d).randomization_fingerprint() != a.randomization_fingerprint()


@pytest.mark.parametrize(("upstream", "kind"), [
    ({"openai": {"base_url": "https://o/v1", "api_key_env": "K"},
      "anthropic": {"base_url": "https://a", "api_key_env": "K"}}, "openai"),
    ({"anthropic": {"base_url": "https://a", "api_key_env": "K"}}, "anthropic"),
    ({"base_url": "https://o/v1", "api_key_env": "K"}, "openai"),
    ({}, "mock"),
])
def test_named_endpoints_are_used_without_kind(upstream: dict, kind: str) -> None:
    """A study naming a real endpoint never falls back to the simulated model because
    `kind` was left out."""
    d = base()
    d["upstream"] = upstream
    assert parse_study(d).upstream.kind == kind


def test_explicit_mock_with_named_endpoints_is_refused() -> None:
    d = base()
    d["upstream"] = {"kind": "mock", "openai": {"base_url": "https://o/v1", "api_key_env": "K"}}
    assert problems(d) == ['upstream: kind = "mock" (the built-in simulated model) would ignore '
                           "[upstream.openai]: remove kind, or set it to the endpoint to use"]


def test_analysis_reading_speed_is_a_validated_setting() -> None:
    assert parse_study(base()).analysis.reading_tps == 5.3
    d = base()
    d["analysis"] = {"reading_tps": 4.0}
    assert parse_study(d).analysis.reading_tps == 4.0
    d["analysis"] = {"reading_tps": 300}
    (msg,) = problems(d)
    assert msg.startswith("analysis.reading_tps:") and "50" in msg
    d["analysis"] = {"reading_speed": 4.0}
    assert problems(d)[0].startswith("analysis.reading_speed")


def test_observe_design_has_no_arms() -> None:
    d = base()
    d["study"]["design"] = "observe"
    d["study"].pop("unit", None)
    assert d.get("arms")  # the example keeps two arms for switching designs
    assert problems(d) == ["arms: design 'observe' has no arms (a team's own work, no "
                           "trial): remove the [[arms]] tables"]
    d.pop("arms")
    cfg = parse_study(d)
    assert cfg.study.design == "observe" and cfg.study.unit == "participant"
