"""PNG plots: confidence histograms and reliability diagrams (one or several models side by side)."""

from __future__ import annotations

import os
from pathlib import Path

from skillgraft.lazy import np

from skillgraft.lazy import plt

from skillgraft.evaluate.metrics import ece, reliability_bins
from skillgraft.io import atomic_path


def panel_margins(fig, *, left: float = 0.75, right: float = 0.2, bottom: float = 0.55, top: float = 0.2,
                  gap: float = 0.5) -> None:
    """Place a figure's row of axes with fixed margins in inches (room for tick labels, axis labels, two-line
    titles): what ``tight_layout`` finds for the report's own figures, without the extra text layout pass it costs
    (a quarter of a figure's CPU time, measured; a graft report draws four). tests/test_metrics.py checks that no
    panel's text leaves the canvas or meets another's."""
    w, h = fig.get_size_inches()
    n = max(1, len(fig.axes))
    width = (w - left - right - gap * (n - 1)) / n
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h,
                        wspace=gap / width if n > 1 else None)


def _titled_margins(fig, title: str) -> None:
    """Margins of a row of panels with two-line titles, and room for the figure's title above them."""
    if title:
        fig.suptitle(title, fontsize=10, y=1 - 0.08 / fig.get_size_inches()[1], va="top")
    panel_margins(fig, top=0.75 if title else 0.5)


def confidence_histogram(models: dict[str, np.ndarray], path: str | os.PathLike, *, title: str = "") -> Path:
    """Histogram of max-probability per model (paper Fig. 6): over-confident models pile up near 1."""
    fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.2), squeeze=False, sharey=True)
    for ax, (name, probs) in zip(axes[0], models.items()):
        conf = probs.max(-1)
        ax.hist(conf, bins=np.linspace(1 / probs.shape[1], 1, 21), color="tab:blue", edgecolor="white")
        ax.set_title(f"{name}\nmean conf {conf.mean():.3f}", fontsize=9)
        ax.set_xlabel("confidence (max probability)")
    axes[0][0].set_ylabel("examples")
    _titled_margins(fig, title)
    return save_figure(fig, path, layout=False)


def reliability_diagram(models: dict[str, tuple[np.ndarray, np.ndarray]], path: str | os.PathLike, *,
                        title: str = "") -> Path:
    """Accuracy vs confidence per bin (10 equal-width bins) for each ``name: (probs, labels)``."""
    fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.6), squeeze=False)
    for ax, (name, (probs, labels)) in zip(axes[0], models.items()):
        bins = reliability_bins(probs, labels)
        centers = [(lo + hi) / 2 for lo, hi in zip(bins["lo"], bins["hi"])]
        acc = [0 if np.isnan(a) else a for a in bins["accuracy"]]
        ax.bar(centers, acc, width=0.1, edgecolor="black", color="tab:orange", label="accuracy")
        ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(f"{name}\nECE {ece(probs, labels):.3f}", fontsize=9)
        ax.set_xlabel("confidence")
    axes[0][0].set_ylabel("accuracy")
    axes[0][0].legend(fontsize=7, loc="upper left")
    _titled_margins(fig, title)
    return save_figure(fig, path, layout=False)


# A 1x1 PNG: what every figure is written as under SKILLGRAFT_FIGURES=placeholder (a test-suite switch)
PLACEHOLDER_PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
                                "0000000d49444154789c63f8ffffff7f0009fb03fd2a86e38a0000000049454e44ae426082")


def save_figure(fig, path: str | os.PathLike, *, layout: bool = True) -> Path:
    """Write a matplotlib figure as PNG atomically (110 dpi) and close it; ``layout``: tight layout first (else the
    caller placed the axes, e.g. with :func:`panel_margins`). ``SKILLGRAFT_FIGURES=placeholder`` (a test-suite
    switch, never a default: tests/conftest.py sets it) writes a 1x1 PNG instead of rendering the figure, which is
    built all the same: rendering is most of a figure's cost and most tests never look at the pixels.
    ``SKILLGRAFT_FIGURES=png:NAME,…`` renders only the files whose names match a pattern (placeholders elsewhere)."""
    path = Path(path)
    mode = os.environ.get("SKILLGRAFT_FIGURES")
    if mode == "placeholder" or (mode or "").startswith("png:") and not _named(path.name, mode[4:]):
        with atomic_path(path) as tmp:
            Path(tmp).write_bytes(PLACEHOLDER_PNG)
        plt.close(fig)
        return path
    if layout:
        fig.tight_layout()
        fig.set_layout_engine(None)  # laid out: savefig need not draw the figure once more first
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def _named(name: str, patterns: str) -> bool:
    from fnmatch import fnmatch  # noqa: PLC0415

    return any(fnmatch(name, p) for p in patterns.split(","))

