"""Models to compare: pre-trained, head only, fine-tuned, and θ_pre with a graft applied — and their rows.

Every report shows the same baselines (DESIGN: pre-trained; fine-tuned; with a new head, *head only*),
and every row gets the same derived columns, computed here once:

    share of FT = score / score_FT
    gap closed  = (score − score_ref) / (score_FT − score_ref),  ref = head only (head mode) else pre-trained
    loss recovered = (L_pre − L) / (L_pre − L_FT)    (generative data: completion loss)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from skillgraft.lazy import np

from skillgraft.data.loading import Example
from skillgraft.evaluate.metrics import share_of_ft
from skillgraft.evaluate.predict import evaluate
from skillgraft.evaluate.rows import Row
from skillgraft.graft.graft import Graft
from skillgraft.graft.region import Region
from skillgraft.models.anatomy import carried_names, graftable_names, is_carried
from skillgraft.models.freezing import param_groups
from skillgraft.pipeline.member import Member, PreState
from skillgraft.pipeline.workbench import Workbench


@dataclass
class Variant:
    """A model to evaluate: the FT scorer itself, θ_pre, or θ_pre with a graft applied."""

    name: str
    kind: str                      # pre | head-only | ft | graft | retrain | bitfit | lora | ia3 | baseline ...
    params: int                    # body parameters it changes/trains (the new head not counted)
    graft: Graft | None = None
    budget: float | None = None
    outside: str = "pre"           # "zero": lottery-ticket-zero (graftable coordinates outside γ set to 0)
    info: dict = field(default_factory=dict)
    localizer: str | None = None   # the localizer whose region it applies (None: pre, head only, FT)
    budget_key: str | None = None  # the learned graft's budget it is (a graft) or is matched to (a baseline)

    @contextlib.contextmanager
    def use(self, member: Member) -> Iterator:
        """The scorer computing this variant (θ_pre is restored bit-exactly on exit; lottery-ticket-zero restores
        it from θ_pre's files where they hold the same values, instead of a backup of the body in memory)."""
        if self.kind == "ft":
            yield member.ft
        elif self.graft is None:
            yield member.pre
        else:
            files = member.inputs.pre_files if self.outside == "zero" else None
            with self.graft.applied(member.pre, outside=self.outside, pre_files=files):
                yield member.pre


@dataclass(eq=False)
class ResultRow(Row):
    """One model's row of a report: what it is, its metrics on one evaluation set (in :func:`evaluate`'s order),
    the derived columns (:func:`derive`) and, for a saved graft, its file's bytes (``file_bytes``).

    Read-only as a mapping of its CSV/JSON columns (:meth:`columns`: ``model, kind, params``, the metrics, the
    derived columns that apply, ``file_bytes`` when set), so reports index it by column name; it is written
    through its typed fields only.
    """

    model: str
    kind: str
    params: int
    metrics: dict[str, Any]
    density: float | None = None
    share_of_ft: float | None = None
    gap_closed: float | None = None
    loss_recovered: float | None = None
    file_bytes: int | None = None  # a saved graft's graft.safetensors
    # its identity, typed (not columns: the report's names are display text, never parsed back)
    localizer: str | None = None   # the localizer whose region it applies (None: pre, head only, FT)
    budget: str | None = None      # the learned graft's budget key it is (a graft) or is matched to (a baseline)
    split: str = "test"            # the evaluation set its metrics are on

    @property
    def score(self) -> float:
        return self.metrics["score"]

    @property
    def ece(self) -> float:
        return self.metrics["ece"]

    @property
    def loss(self) -> float | None:
        """Completion loss (generative data), else None."""
        return self.metrics.get("loss")

    def columns(self) -> dict[str, Any]:
        """The row as CSV/JSON columns, in report order (derived columns only where they apply)."""
        derived = {k: getattr(self, k) for k in _DERIVED if getattr(self, k) is not None}
        saved = {"file_bytes": self.file_bytes} if self.file_bytes is not None else {}
        return {"model": self.model, "kind": self.kind, "params": self.params, **self.metrics, **derived, **saved}

    def __getitem__(self, key: str):
        if key in _NAMED or (key in _DERIVED and getattr(self, key) is not None):
            return getattr(self, key)
        if key in self.metrics:
            return self.metrics[key]
        if key == "file_bytes" and self.file_bytes is not None:
            return self.file_bytes
        raise KeyError(key)

    def __iter__(self):
        return iter(self.columns())

    def __len__(self) -> int:
        return len(self.columns())


_NAMED = ("model", "kind", "params")
_DERIVED = ("density", "share_of_ft", "gap_closed", "loss_recovered")


def universe(pre) -> dict[str, tuple[int, ...]]:
    """Shapes of the graftable body tensors (the universe regions live in)."""
    names = set(graftable_names(pre))
    return {n: tuple(p.shape) for n, p in pre.named_parameters() if n in names}


def base_variants(member: Member) -> list[Variant]:
    """The baselines every graft report shows: pre-trained, head only (head mode), fine-tuned."""
    out = [Variant("pre-trained", "pre", 0)]
    if carried_names(member.pre):  # a new head (head mode) or a classifier's own head θ_pre lacks
        empty = Region.empty(universe(member.pre))
        out.append(Variant("head only", "head-only", 0, Graft.from_models(member.pre, member.ft, empty)))
    frozen_embeddings = member.inputs.finetune_config.freeze_embeddings
    ft = member.pre if member.released else member.ft  # released θ_ft: the same tensors as θ_pre (checked)
    groups = param_groups(ft)  # embeddings by structure (BERT's `embeddings.*`, Llama/Gemma's `embed_tokens`)
    body = sum(p.numel() for n, p in ft.named_parameters()
               if not is_carried(n, ft) and not (frozen_embeddings and groups.get(n) == "embeddings"))
    out.append(Variant("fine-tuned", "ft", body))
    return out


def graft_label(budget) -> str:
    """Report label of a learned graft of ``budget`` (a Budget, a fraction, or None for rounded γ)."""
    label = getattr(budget, "label", None)
    if label is not None:
        return "graft (rounded γ)" if label == "round" else f"graft {label}"
    return "graft (rounded γ)" if budget is None else f"graft {float(budget):g}"


def graft_variant(member: Member, region: Region, budget, metadata: dict | None = None, *, name: str | None = None,
                  kind: str = "graft", outside: str = "pre", localizer: str | None = None,
                  budget_key: str | None = None) -> Variant:
    """θ_pre + γ⊙(θ_ft − θ_pre) on ``region`` (plus the new head), as a Variant (``localizer``, ``budget_key``:
    its typed identity in the report's rows)."""
    meta = {"task": member.task, "mode": member.pre.mode, "k": member.k, "seed": member.seed,
            **member.inputs.graft_metadata.to_dict(), **(metadata or {})}
    graft = Graft.from_models(member.pre, member.ft, region, meta)
    fraction = getattr(budget, "fraction", budget if isinstance(budget, float) else None)
    return Variant(name or graft_label(budget), kind, len(region), graft, fraction, outside, localizer=localizer,
                   budget_key=budget_key)


def score_ft_first(bench: Workbench, name: str, *, release: bool, progress: bool = False) -> None:
    """Member ``name`` of ``bench`` as a lean pair (θ_pre deferred, ``from_pair(..., lean=True)``): score FT on the
    test set, release θ_ft to its files when ``release`` (what follows reads it from them:
    :meth:`Workbench.release_to_files`, as ``skillgraft merge`` does), then load θ_pre; the two are never resident
    together."""
    member = bench.members[name]
    if member.pre_state != PreState.DEFERRED:  # θ_pre loaded already: nothing deferred
        return
    evaluate_variant(member, Variant("fine-tuned", "ft", 0), member.test, progress="fine-tuned" if progress else False)
    bench.scored(name)
    if release:
        bench.release_to_files(name)
    bench.load_pre(name)


def evaluate_variant(member: Member, variant: Variant, examples: list[Example], set_name: str = "test",
                     batch_size: int = 64, progress: bool | str = False) -> tuple[dict, np.ndarray]:
    """Metrics of a variant on ``examples`` (agreement with FT on the same set when FT was run first).

    FT's metrics are kept per set (``member.ft_metrics``): once θ_ft is released they are its row."""
    if variant.kind == "ft" and member.released:
        return dict(member.ft_metrics[set_name]), member.probs[set_name]
    with variant.use(member) as scorer:
        metrics, probs = evaluate(scorer, examples, batch_size=batch_size, reference=member.probs.get(set_name),
                                  progress=progress)
    if variant.kind == "ft":
        metrics["agreement"] = 1.0
        Workbench.record(member, set_name, metrics, probs)
    return metrics, probs


def compare(member: Member, variants: list[Variant], examples: list[Example] | None = None, set_name: str = "test",
            progress: bool = False) -> tuple[list[ResultRow], dict[str, np.ndarray]]:
    """Every variant on one evaluation set (FT first: the agreement reference); rows with derived columns.

    Inside a store stage (a :func:`~skillgraft.resume.resume_point`) the variants scored so far are saved every few
    minutes, and a re-run scores only the rest (an hour of Gemma rows on a CPU survives a stopped session)."""
    from skillgraft.resume import checkpoint  # noqa: PLC0415

    examples = member.test if examples is None else examples
    saved = checkpoint("compare", {"set": set_name, "rows": len(examples),
                                   "variants": [[v.name, v.kind, v.params] for v in variants]})
    done: dict = (saved.load() or {}).get("done", {}) if saved is not None else {}
    rows, probs = [], {}
    for v in sorted(variants, key=lambda v: v.kind != "ft"):
        if v.name in done:  # scored before the stop: FT's record (the agreement reference) restored with it
            m, p = dict(done[v.name]["metrics"]), done[v.name]["probs"]
            if v.kind == "ft":
                Workbench.record(member, set_name, m, p)
        else:
            m, p = evaluate_variant(member, v, examples, set_name, progress=v.name if progress else False)
            done[v.name] = {"metrics": dict(m), "probs": p}
            if saved is not None and saved.due():
                saved.save({"done": done})
        probs[v.name] = p
        rows.append(ResultRow(v.name, v.kind, v.params, m, localizer=v.localizer, budget=v.budget_key,
                              split=set_name))
    order = {v.name: i for i, v in enumerate(variants)}
    rows.sort(key=lambda r: order[r.model])
    return derive(rows, universe_size=sum(int(np.prod(s)) for s in universe(member.pre).values())), probs


def derive(rows: list[ResultRow], *, universe_size: int) -> list[ResultRow]:
    """Set density, share of FT and gap closed (from head only, else from pre-trained) on each row."""
    score = {r.kind: r.score for r in rows if r.kind in ("ft", "head-only", "pre")}
    ft = score.get("ft")
    ref = score.get("head-only", score.get("pre"))
    for r in rows:
        # a share of the graftable universe: FT (and any row counting tensors outside it: embeddings, a head it
        # trained) is dense, 1 — never 2.10e+00
        r.density = min(1.0, r.params / universe_size) if universe_size else 0.0
        r.share_of_ft = share_of_ft(r.score, ft)
        if ft is not None and ref is not None and ft != ref:
            r.gap_closed = (r.score - ref) / (ft - ref)
    loss = {r.kind: r.metrics["loss"] for r in rows if r.kind in ("ft", "pre") and "loss" in r.metrics}
    if len(loss) == 2 and loss["pre"] != loss["ft"]:  # generative: share of FT's loss drop the model recovers
        for r in rows:
            if "loss" in r.metrics:
                r.loss_recovered = (loss["pre"] - r.metrics["loss"]) / (loss["pre"] - loss["ft"])
    return rows


def rows_of(member: Member, rows: list[dict], **extra) -> list[dict]:
    """``compare`` rows with the draw they belong to and params as % of all model parameters."""
    return [{**extra, "task": member.task, "k": member.k, "seed": member.seed, **r,
             "params_pct": 100.0 * r["params"] / member.total_parameters} for r in rows]
