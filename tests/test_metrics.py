import numpy as np
import pytest

from skillgraft.evaluate import accuracy, agreement, ece, f1, reliability_bins, summarize
from skillgraft.evaluate.plots import confidence_histogram, reliability_diagram


def test_ece_hand_computed():
    # two bins used: conf 0.95 (2 examples, 1 correct) and conf 0.65 (2 examples, both correct)
    probs = np.array([[0.95, 0.05], [0.05, 0.95], [0.65, 0.35], [0.35, 0.65]])
    labels = np.array([0, 0, 0, 1])
    expect = 0.5 * abs(0.5 - 0.95) + 0.5 * abs(1.0 - 0.65)
    assert ece(probs, labels) == pytest.approx(expect)
    assert ece(np.array([[1.0, 0.0]]), np.array([0])) == pytest.approx(0.0)


def test_ece_bin_edges_right_closed():
    # confidence exactly 0.7 falls in bin (0.6, 0.7], not (0.7, 0.8]
    bins = reliability_bins(np.array([[0.7, 0.3]]), np.array([0]))
    assert bins["count"][6] == 1 and sum(bins["count"]) == 1


def test_accuracy_f1_agreement():
    probs = np.array([[0.2, 0.8], [0.6, 0.4], [0.3, 0.7], [0.9, 0.1]])
    labels = np.array([1, 1, 0, 0])
    assert accuracy(probs, labels) == 0.5
    assert f1(probs, labels) == pytest.approx(2 * 1 / (2 * 1 + 1 + 1))
    assert agreement(probs, probs[::-1]) == 0.0
    s = summarize(probs, labels, metric="f1", reference=probs)
    assert s["score"] == s["f1"] and s["agreement"] == 1.0


@pytest.mark.figures
def test_plots_are_pngs(tmp_path):
    rng = np.random.default_rng(0)
    p = rng.dirichlet([1, 1], size=50)
    y = rng.integers(0, 2, 50)
    for path in (confidence_histogram({"a": p, "b": p}, tmp_path / "c.png"),
                 reliability_diagram({"a": (p, y)}, tmp_path / "r.png")):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert _png_size(path) == ((880, 352) if path.name == "c.png" else (440, 396))  # rendered: 110 dpi
    assert not list(tmp_path.glob(".*tmp"))


def _png_size(path) -> tuple[int, int]:
    """(width, height) from a PNG's header (IHDR)."""
    head = path.read_bytes()[16:24]
    return int.from_bytes(head[:4], "big"), int.from_bytes(head[4:], "big")


def test_the_suites_figures_are_placeholders_unless_a_test_renders(tmp_path, monkeypatch):
    """tests/conftest.py's SKILLGRAFT_FIGURES=placeholder: a figure is built, then written as a 1x1 PNG that reads
    back (atomically, the figure closed); png:NAME,… renders those files only; unset (a user's run), it renders."""
    from PIL import Image

    import matplotlib.pyplot as plt

    p = np.random.default_rng(0).dirichlet([1, 1], size=20)
    path = confidence_histogram({"a": p}, tmp_path / "c.png")
    with Image.open(path) as im:
        assert im.size == (1, 1)
    assert not plt.get_fignums() and not list(tmp_path.glob(".*tmp"))
    monkeypatch.setenv("SKILLGRAFT_FIGURES", "png:x.png,d*.png")  # a `figures(NAME, …)` test: those files only
    assert _png_size(confidence_histogram({"a": p}, tmp_path / "e.png")) == (1, 1)
    assert _png_size(confidence_histogram({"a": p}, tmp_path / "d1.png")) == (440, 352)
    monkeypatch.delenv("SKILLGRAFT_FIGURES")
    assert _png_size(confidence_histogram({"a": p}, tmp_path / "d.png")) == (440, 352)


def test_share_of_ft_is_derived_once_for_graft_and_merge_rows():
    """A graft report's share_of_ft and a merge row's normalized accuracy are the same function of the scores."""
    import math

    from skillgraft.evaluate.metrics import share_of_ft
    from skillgraft.merge.base import Scored
    from skillgraft.pipeline.variants import ResultRow, derive

    assert share_of_ft(0.45, 0.9) == 0.5 and share_of_ft(0.5, 0.0) is None and share_of_ft(0.5, None) is None
    rows = derive([ResultRow("FT", "ft", 10, {"score": 0.9}), ResultRow("graft", "graft", 1, {"score": 0.45})],
                  universe_size=100)
    merged = Scored("stitch", "x", test={"t": 0.45, "u": 0.3}).normalized(Scored("fine-tuned", "", test={"t": 0.9,
                                                                                                        "u": 0.0}))
    assert rows[1].share_of_ft == merged["t"] == share_of_ft(0.45, 0.9) and math.isnan(merged["u"])


# one panel (no gap to place) and six; a row of three is placed by the same rule as six (a gap between panels),
# each panel of the same size (figsize = 4 inches a panel)
@pytest.mark.parametrize("panels", [1, 6])
def test_report_figures_fit_their_text_without_tight_layout(panels, monkeypatch, tmp_path):
    """The report's figures are placed with fixed margins (panel_margins), not tight_layout: every title, label and
    tick label lies inside the canvas and none overlaps another, for one to six panels, with and without a title."""
    import matplotlib.pyplot as plt

    from skillgraft.verbs.graft import share_plot, size_plot

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep each figure to measure it once it is drawn
    rng = np.random.default_rng(0)
    names = ["fine-tuned", "paper (learned) 0.0001", "keep ≥ 95 % of FT", "top-|Δ| 0.0001", "random 1e-05", "x"]
    y = rng.integers(0, 2, 60)
    for title in ("", "SST-2 test: reliability"):
        confidence_histogram({n: rng.dirichlet([1, 1], 60) for n in names[:panels]}, tmp_path / "c.png", title=title)
        reliability_diagram({n: (rng.dirichlet([1, 1], 60), y) for n in names[:panels]}, tmp_path / "r.png",
                            title=title)
    from skillgraft.pipeline.variants import ResultRow

    rows = [ResultRow("fine-tuned", "ft", 0, {"score": 912.0}, share_of_ft=1.0),
            ResultRow("pre-trained", "pre", 0, {"score": 480.5}, share_of_ft=0.5)]
    rows += [ResultRow(f"graft {p}", "graft", p, {"score": 800.0 + p / 100}, share_of_ft=0.9, budget=str(p))
             for p in (20, 2_000, 200_000)]
    rows += [ResultRow(f"top-movement @ graft {p}", "baseline", p, {"score": 700.0}, share_of_ft=0.8,
                       localizer="movement", budget=str(p)) for p in (20, 2_000)]
    size_plot(rows, tmp_path / "s.png", "loss")
    share_plot(rows, tmp_path / "h.png")
    assert len(figures) == 6
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        fig.draw(renderer)
        boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]  # what each panel draws: labels, ticks, title
        boxes += [t.get_window_extent(renderer) for t in fig.texts]  # the figure's title, when it has one
        for b in boxes:
            assert b.x0 >= -1 and b.y0 >= -1 and b.x1 <= fig.bbox.width + 1 and b.y1 <= fig.bbox.height + 1, b
        for i, a in enumerate(boxes):
            assert not any(a.overlaps(b) for b in boxes[i + 1:]), (a, boxes)
