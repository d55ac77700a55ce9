"""The demo's console, the report's banner, its figure and its tables say the same thing
(issue 20): same estimand, numbers, CI and units; no ψ line or CI band without a reported
threshold; the model-choice sentences match their numbers."""

from __future__ import annotations

import copy
import html
import re
from pathlib import Path
from typing import Any

import pytest

from flowtrial.analysis import report_figures
from flowtrial.analysis.report import render_html, run_analysis
from flowtrial.analysis.threshold import smooth_vs_hinge_text
from flowtrial.demo import _threshold_line_of, demo_study_text
from flowtrial.study.config import load_study
from flowtrial.study.simulator import SimParams, simulate_virtual
from flowtrial.study.storage import init_db

HEADLINE = re.compile(r"the median person's threshold is ([\d.]+) s of ([a-z ]+) "
                      r"\(95 % CI ([\d.]+)–([\d.]+) s\)")


def _study(tmp: Path, seed: int, params: SimParams, participants: int, prompts: int) -> Path:
    """The demo's study text (at time_scale 10), simulated virtually."""
    text = demo_study_text(seed, 10)
    (tmp / "study.toml").write_text(text, encoding="utf-8")
    config = load_study(tmp / "study.toml")
    db = init_db(tmp / "flowtrial.db", config, text)
    simulate_virtual(db, config, params, participants, 2, prompts, seed)
    db.dispose()
    return tmp / "flowtrial.db"


class Legends:
    """The switch-vs-wait figure's legend labels and shaded spans, captured as it is saved."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.labels: list[str] = []
        self.spans = 0
        real = report_figures._uri

        def capture(fig: Any, tight: bool = True) -> str:
            ax = fig.axes[0]
            if ax.get_ylabel().startswith("P(context switch"):
                legend = ax.get_legend()
                self.labels = [t.get_text() for t in legend.get_texts()] if legend else []
                self.spans = len(ax.patches)  # axvspan: the CI of ψ (fill_between is not one)
            return real(fig, tight)

        monkeypatch.setattr(report_figures, "_uri", capture)


def _banner(page: str) -> str:
    div = re.search(r'<div class="headline">(.*?)</div>', page, re.S)
    assert div is not None
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", div.group(1))).split())


Analysed = tuple[dict, str, Legends]


def _analysed(tmp: Path, seed: int, truth: str = "hinge") -> Analysed:
    """1,200 cycles with little spread between people and a steep rise: with the hinge truth
    (seed 1) a clear threshold; with the smooth one (seed 2) none, which the threshold test
    must say. (300 cycles were too few once the monotone-curve alternative joined the test:
    the hinge then beat it at p = 0.1 only; 600 once every alternative near the best had to
    be beaten: the straight rise in seconds, second to the best, stood. At 900 the best
    alternative alone stood, p = 0.25, as it would have for the best-only test.)"""
    db = _study(tmp, seed, SimParams(truth=truth,  # type: ignore[arg-type]
                                     threshold_logsd=0.1, p_high=0.9), 15, 40)
    with pytest.MonkeyPatch.context() as mp:
        legends = Legends(mp)
        results = run_analysis(db, tmp / "report", n_boot=20, seed=0, workers=1)
    return results, (tmp / "report" / "report.html").read_text(encoding="utf-8"), legends


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> Analysed:
    return _analysed(tmp_path_factory.mktemp("found"), 1)


@pytest.fixture(scope="module")
def not_found(tmp_path_factory: pytest.TempPathFactory) -> Analysed:
    return _analysed(tmp_path_factory.mktemp("not_found"), 2, "smooth")


def test_found_threshold_console_banner_figure_and_truth_table_agree(found: Analysed) -> None:
    results, page, legends = found
    thr = results["threshold"]
    assert thr["found"], thr["reason"]
    console = _threshold_line_of(results)
    assert console is not None
    said = HEADLINE.search(console)
    shown = HEADLINE.search(_banner(page))
    assert said and shown and said.groups() == shown.groups()
    psi, lo, hi = (float(said.group(i)) for i in (1, 3, 4))
    pt = thr["personal"]
    assert said.group(2) == "idle wait"
    assert psi == pytest.approx(pt["median_psi_s"], rel=5e-3)  # the headline estimand,
    assert (lo, hi) == pytest.approx(tuple(pt["ci_s"]), rel=5e-3)  # not the pooled ψ*
    assert "Simulated truth: the participants' median personal threshold is 8 s." in console
    # The figure draws the same ψ and CI, and the truth table shows the same estimate.
    assert f"median personal ψ = {said.group(1)} s (95 % CI {lo:.3g}–{hi:.3g} s)" in \
        legends.labels
    assert legends.spans == 1  # the CI of ψ
    truth_row = re.search(r"<tr><td>median personal threshold \(s\)</td><td>8</td>"
                          r"<td>([\d.]+)</td>\s*<td>([\d.]+)–([\d.]+)</td>", page)
    assert truth_row and truth_row.groups() == (said.group(1), said.group(3), said.group(4))


def test_no_threshold_means_no_psi_line_and_the_same_sentence(not_found: Analysed) -> None:
    results, page, legends = not_found
    thr, pt = results["threshold"], results["threshold"]["personal"]
    assert not thr["found"] and pt["median_psi_s"] is not None
    console = _threshold_line_of(results)
    assert console is not None and console.startswith("No flow threshold reported: ")
    assert "ψ =" not in console and "95 % CI" not in console
    sentence = console.split(" Simulated truth")[0]
    assert _banner(page).startswith(sentence)
    # The figure has the fits and the true ψ but no estimated ψ line and no CI band for it.
    assert legends.labels and not any("median personal ψ" in x for x in legends.labels)
    assert not any(x.startswith("ψ =") for x in legends.labels)
    assert legends.spans == 0  # no CI band either
    # The reason names the winning no-threshold explanation and the test's own p-value.
    test = pt["alternatives"]
    assert "switching rises steadily with the wait" in sentence
    got = re.search(r"\(p = ([\d.]+) > 0\.05, parametric bootstrap, "
                    r"(\d+)(?: of up to \d+)? replicates\)", sentence)
    assert got is not None and float(got.group(1)) == pytest.approx(test["p_value"], abs=0.006)
    assert int(got.group(2)) == test["n_boot"]


@pytest.mark.parametrize(
    ("aic", "bic", "says"),
    [
        ((107.26, 108.14), (120.0, 119.5), "AIC favours the hinge but BIC favours the smooth"),
        ((109.0, 108.0), (118.0, 119.0), "BIC favours the hinge but AIC favours the smooth"),
        ((109.0, 108.0), (121.0, 119.0), "a smooth logistic dose-response fits as well or better"),
    ],
)
def test_model_comparison_sentence_matches_its_numbers(
        aic: tuple[float, float], bic: tuple[float, float], says: str) -> None:
    text = smooth_vs_hinge_text({"hinge": aic[0], "smooth": aic[1]},
                                {"hinge": bic[0], "smooth": bic[1]})
    assert says in text
    assert f"AIC {aic[0]:.2f} vs {aic[1]:.2f}, BIC {bic[0]:.2f} vs {bic[1]:.2f}" in text


def test_sensitivity_row_with_small_p_but_no_threshold_is_explained(
        not_found: Analysed) -> None:
    results = copy.deepcopy(not_found[0])
    row = results["threshold_sensitivity"][0]
    row.update(p_exists=0.005, model_choice="smooth")
    page = " ".join(render_html(results, {}).split())
    cells = re.search(rf"<tr><td>{row['wait_measure']}</td>.*?</tr>", page)
    assert cells is not None and "smooth †" in cells.group(0)
    assert "threshold?" not in page
    assert "† switching depends on the wait, but not through a threshold" in page


def test_the_demo_duration_is_stated_one_way() -> None:
    from flowtrial import cli, demo, simulate_commands

    root = Path(__file__).resolve().parents[2]
    texts = {
        "flowtrial/demo.py": demo.__doc__ or "",
        "cli summary": cli.COMMANDS["demo"].summary,
        "demo command help": simulate_commands.demo.__doc__ or "",
        "README.md": (root / "README.md").read_text(encoding="utf-8"),
        "docs/researchers/demo.md": (root / "docs/researchers/demo.md").read_text(
            encoding="utf-8"),
    }
    for where, text in texts.items():
        assert "2–5 minutes" in text, where
        assert not re.search(r"about two minutes|under two minutes|\b2 minutes|1 m 58",
                             text), where
