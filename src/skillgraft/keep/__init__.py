"""Keep targets: ask for a share of FT's score (or of agreement with FT), get the smallest graft reaching it, with a
stated confidence (docs/keep.md). One room, in reading order:

- :mod:`.stats` — the bounds and tests (NumPy and SciPy only; a low floor: nothing of skillgraft above ``errors``);
- :mod:`.spec` — :class:`~.spec.KeepSpec`, what a search is asked (the CLI's ``--keep…`` options);
- :mod:`.search` — the search over a nested family's sizes (:func:`~.search.search_keep`, :class:`~.search.KeepResult`);
- :mod:`.scoring` — with models: a region's selection outcome, :func:`~.scoring.keep_search` over a
  :class:`~skillgraft.graft.ranking.Ranking`;
- :mod:`.selection` — the selection rows (``--keep-data``, the dev split or a held-out slice) and what they can confirm;
- :mod:`.run` — one member's keep search as a store stage, and a routed merge's kept graft;
- :mod:`.report` — its typed rows, console lines and report section.

Its floor is the cores' (beside ``graft/`` and ``evaluate/``): it imports graft's regions and localizers and is
imported by graft's localizers (a learned order's keep targets), never by a module of ``models/`` or ``data/``, and it
imports no ``pipeline/`` or higher module.
"""

from skillgraft.lazy import lazy_exports

__getattr__ = lazy_exports(__name__, {
    "KeepSpec": "skillgraft.keep.spec", "check_share": "skillgraft.keep.spec",
    "KeepResult": "skillgraft.keep.search", "Probe": "skillgraft.keep.search", "search_keep": "skillgraft.keep.search",
    "keep_search": "skillgraft.keep.scoring", "graft_outcome": "skillgraft.keep.scoring",
    "selection_outcome": "skillgraft.keep.scoring",
})
