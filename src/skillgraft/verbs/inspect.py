"""``skillgraft inspect``: a graft's (or a PEFT SHiRA adapter's) size, density and where its parameters sit (per
layer × module type; paper Figs. 9/10); with ``out``, written there as ``distribution.json`` + ``distribution.png``
(both, or neither). A reading verb: nothing is written into the graft folder it reads."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skillgraft.export.base import human_size
from skillgraft.verbs.result import VerbResult

if TYPE_CHECKING:
    from skillgraft.graft.inspect import Comparison, Distribution


@dataclass
class InspectResult(VerbResult):
    """What ``skillgraft inspect`` found: the graft, its file's bytes, the distribution and the comparison."""

    graft: object  # skillgraft.graft.Graft
    file_bytes: int
    distribution: Distribution
    out: Path | None  # where the distribution's files were written (None: printed only)
    other: object | None = None  # the --compare graft's Region
    graft_dir: Path | None = None  # the folder read, as given
    compare: Path | None = None  # the --compare folder, as given

    def lines(self) -> list[str]:
        """The summary lines (markup: the folder in bold)."""
        g, size, graft_dir, compare = self.graft, self.file_bytes, self.graft_dir, self.compare
        out = [f"[bold]{graft_dir}[/]: {g.size:,} grafted parameters, density {g.region.density:.3e} of "
               f"{g.region.universe_size:,} graftable; carried {g.carried_size:,}; file {human_size(size)} "
               f"({size / max(1, g.size):.1f} bytes/parameter); base {g.base_model} [{g.base_fingerprint[:12]}]"]
        if self.other is not None:
            c = self.comparison()
            out.append(f"vs {compare}: shared {c.shared:,}; overlap |A∩B|/|B| {c.overlap:.4f}; "
                       f"|A∩B|/|A| {c.overlap_of_self:.4f}; IoU {c.iou:.4f}")
        return out

    def comparison(self) -> Comparison | None:
        """The graft (A) against the ``--compare`` one (B): shared coordinates, |A∩B|/|B|, |A∩B|/|A|, IoU."""
        from skillgraft.graft.inspect import Comparison  # noqa: PLC0415

        return None if self.other is None else Comparison.of(self.graft.region, self.other)

    def document(self) -> dict:
        """What ``--json`` prints: size, density, base, distribution, output folder (and the comparison)."""
        g, graft_dir, compare = self.graft, self.graft_dir, self.compare
        doc = {"graft": graft_dir, "size": g.size, "density": g.region.density, "universe": g.region.universe_size,
               "carried": g.carried_size, "file_bytes": self.file_bytes, "base_model": g.base_model,
               "base_fingerprint": g.base_fingerprint, "distribution": self.distribution, "out": self.out}
        if self.other is not None:
            doc["compare"] = {"graft": compare, **self.comparison()}
        return doc


def inspect(graft_dir: str | os.PathLike, *, out: str | os.PathLike | None = None, model: str | None = None,
            compare: str | os.PathLike | None = None, runtime=None) -> InspectResult:
    """Read the graft or adapter in ``graft_dir`` (``model``: a PEFT adapter's base), compare it with ``compare``,
    and, with ``out``, write its distribution there (never into the folder read: before, the default was the graft
    folder itself). ``runtime``: where an adapter's base loads (None: the active placement), passed down."""
    from skillgraft.export import read_graft_or_adapter  # noqa: PLC0415
    from skillgraft.graft.inspect import distribution, plot_distribution  # noqa: PLC0415
    from skillgraft.io import atomic_files, write_json  # noqa: PLC0415
    from skillgraft.models.placement import boundary  # noqa: PLC0415

    runtime = boundary(runtime)  # read once, where the verb starts
    g, weights = read_graft_or_adapter(graft_dir, model, runtime=runtime)
    dist = distribution(g.region)
    other = read_graft_or_adapter(compare, model, runtime=runtime)[0].region if compare is not None else None
    if out is not None:
        out = Path(out)
        with atomic_files(out) as tmp:  # both files, or neither
            write_json(tmp / "distribution.json", dist)
            plot_distribution(dist, tmp / "distribution.png", title=f"{g.metadata.task or ''} graft")
    return InspectResult(g, weights.stat().st_size, dist, out, other, graft_dir,
                         compare)
