"""``skillgraft merge``: several fine-tuned models of one base → one model, stitched from their localized regions,
beside mergekit's dense merges of the same checkpoints (report.md).

1. Inputs are checked before any weights load (:func:`~skillgraft.verbs.merge_inputs.check_inputs`): one data source
   per model, no model twice, one architecture, shapes and vocabulary (the pre-trained model's), one scoring mode.
2. A :class:`~skillgraft.pipeline.workbench.Workbench` holds θ_pre once and loads one θ_ft at a time: each is
   scored, localized and shown to every merge method (mergekit writes its input), then released. Each pair
   (θ_pre, θ_ft,t) is localized by a registered localizer at ``budget`` (regions kept in the store),
   or a given graft is used; every registered merge method (:mod:`skillgraft.merge`) gives its rows: the stitch
   (:mod:`skillgraft.merge.stitch`) under each measured rule, and
3. mergekit's ``linear``, ``task_arithmetic``, ``ties`` and ``dare_ties`` run through ``mergekit-yaml`` on the
   same checkpoints: documented defaults (weight 1, every other parameter mergekit's default) and a grid of λ /
   density chosen on dev rows. Heads of tasks with different label sets cannot be merged, so every method merges
   the *body* (all but the task head) and each task runs on it with its own fine-tuned head.
4. Every model is scored per task on dev and test rows: accuracy, normalized accuracy (÷ the task's own
   fine-tuned model), their means, and bytes stored per task.

Output folder: ``tasks/<task>/`` (classifiers: a complete checkpoint per task, the merged body and the task's
own head; ``AutoModelForSequenceClassification.from_pretrained``) or ``model/`` (causal / masked LMs: one merged
model), ``grafts/<task>/`` (each task's graft: the skill as stored), ``README.md``, ``report.md``,
``merge.json``, ``results.csv``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Annotated

from skillgraft.lazy import np
from pydantic import Field, create_model, field_validator, model_validator

from skillgraft.errors import SkillgraftError
from skillgraft.graft.graft import Graft
from skillgraft.keep.spec import KeepSpec, check_share
from skillgraft.graft.localizers import get_localizer
from skillgraft.graft.selection import Budget
from skillgraft.io import atomic_dir, check_target
from skillgraft.merge import MERGE_METHODS, MergeMethod, Scored, merge_methods
from skillgraft.merge.base import MergeRow, pick_written
from skillgraft.pipeline.report import write_csv
from skillgraft.pipeline.member import Member, PreState
from skillgraft.pipeline.workbench import Workbench
from skillgraft.spec import Spec
from skillgraft.models.spec import MAX_LENGTH
from skillgraft.verbs import converts_into_store
from skillgraft.verbs.merge_inputs import ModelInput, check_inputs, merge_inputs, resolve_inputs
from skillgraft.verbs.merge_report import (MergeResult, readme, report_markdown, summarize, write_grafts,
                                           write_outputs)

__all__ = ["MergeResult", "MergeSpec", "ModelInput", "check_inputs", "merge_models", "resolve_inputs"]


class MergeSettings(Spec):
    """Settings of ``skillgraft merge`` itself (each merge method's are its own ``Options``)."""

    budget: Budget = Field(Budget.parse(5e-3), description="region size per task: a fraction of the graftable "
                                                          "parameters in (0, 1] or a count")
    localizer: str = Field("learned", description="localizer of each task's region (docs/localizers.md)")
    dev_fraction: float = Field(0.2, gt=0, lt=1, description="share of a model's --data rows held out as dev rows "
                                                             "(grid choice) when no --dev-data is given")
    dev_limit: int | None = Field(200, ge=1, description="dev rows per task scored for the grid (seeded sample)")
    mode: str | None = Field(None, description="how to score the models: classifier | prompt | causal | generative "
                                               "(default: from the fine-tuned checkpoints' class)")
    max_length: int = Field(MAX_LENGTH, ge=8, description="max tokens per example")
    refit_heads: int | None = Field(None, ge=1, description="refit each task's head (its last linear layer) on N "
                                                            "labelled training rows per task on every merged body "
                                                            "(never test or dev rows); the report shows every "
                                                            "method with and without it")
    routed: bool = Field(False, description="also write routed/: one base model plus each task's graft and head, "
                                            "loaded by skillgraft.RoutedSkills (a task's graft applied per request)")
    router: str = Field("auto", description="with --routed: the router written beside the skills, fitted on each "
                                            "task's training rows: auto (every kind fitted, whichever routes the dev "
                                            "rows best kept) | centroid | probe | centroid-layers | probe-layers | "
                                            "none (no router; docs/serve.md)")
    # Annotated: the command line hands the text to the validator (as graft's --keep), so "0.9,0.95" is told why
    keep: Annotated[float, "share"] | None = Field(None, description=(
        "with --routed: one share (graft --keep takes several; a merge keeps one graft per task): size each task's "
        "routed graft as the smallest region of the localizer keeping this share "
        "of its fine-tuned model's score on its dev rows (--dev-data, else the --dev-fraction of --data) at "
        "--keep-confidence, instead of --budgets (the stitch keeps --budgets; docs/keep.md)"))
    keep_confidence: float = copy.copy(KeepSpec.model_fields["keep_confidence"])  # graft's --keep-confidence

    @field_validator("keep", mode="before")
    @classmethod
    def _share(cls, value):
        if value is None:
            return None
        if isinstance(value, (list, tuple)) or (isinstance(value, str) and "," in value):
            raise ValueError(f"one share per merge (each routed task keeps one graft; graft --keep takes several), "
                             f"not {value!r}")
        try:
            return check_share(value)
        except SkillgraftError as e:
            raise ValueError(str(e)) from None

    @field_validator("router")
    @classmethod
    def _router(cls, value: str) -> str:
        from skillgraft.graft.router import CHOICES, ROUTERS  # noqa: PLC0415

        if value not in (*CHOICES, *ROUTERS.members):
            raise ValueError(f"unknown router {value!r}; known: {', '.join((*CHOICES, *ROUTERS.members))}")
        return value

    @model_validator(mode="after")
    def _confidence_needs_keep(self):
        if self.keep is None and "keep_confidence" in self.model_fields_set:  # before: silently ignored
            raise SkillgraftError("--keep-confidence is the confidence of a keep search, which only --keep starts "
                                  "(with --routed): give --keep or leave it out")
        return self

    def keep_spec(self) -> KeepSpec:
        """The keep search of each routed task's graft: graft's :class:`KeepSpec` with this merge's one target."""
        return KeepSpec(keep=[self.keep], keep_confidence=self.keep_confidence)


# The options of ``skillgraft merge``: its own settings and every registered method's options (one default each).
MergeSpec = create_model("MergeSpec", __base__=(MergeSettings, *[type(m).Options for m in MERGE_METHODS.values()]),
                         __doc__="Settings of ``skillgraft merge`` (the localizer's own settings are its options).")


# ---------------------------------------------------------------------------------------------- one model
def open_member(pretrained: str, m: ModelInput, spec: MergeSpec, share_pre=None, lean: bool = False,
                runtime=None, opened=None, pre_tensors=None) -> Member:
    """θ_pre, θ_ft and the rows of one model: train (localize), dev (grid choice), test (report). ``lean``: θ_pre
    loads later (:meth:`Workbench.load_pre`), when a causal pair allows it (``from_pair``); ``opened`` and
    ``pre_tensors``: as ``from_pair`` takes them. The member returned is a new one holding the narrowed inputs
    (nothing is written into the one ``from_pair`` made)."""
    from skillgraft.data.sampling import eval_subset  # noqa: PLC0415
    from skillgraft.pipeline.opening import from_pair  # noqa: PLC0415

    member = from_pair(pretrained, m.finetuned, m.data, mode=spec.mode, max_length=spec.max_length,
                       share_pre=share_pre, lean=lean, runtime=runtime, opened=opened, pre_tensors=pre_tensors)
    data = member.data
    train = data.train
    if m.dev_data is not None:
        labels = tuple(data.task.labels) or None
        dev_spec = m.data.replace(data=m.dev_data, eval_data=m.dev_data, k=None, test_limit=None,
                                  labels=list(labels) if labels and member.ft.mode == "generative" else m.data.labels)
        dev = dev_spec.load(labels if member.ft.mode == "classifier" else None).test
        files = [*(member.inputs.data_files or []), m.dev_data]
    else:
        files = member.inputs.data_files
        order = np.random.RandomState(data.seed).permutation(len(train))
        n_dev = int(round(spec.dev_fraction * len(train)))
        if n_dev < 1 or n_dev >= len(train):
            raise SkillgraftError(f"{m.name}: {len(train)} row(s) of --data cannot give both localization and dev "
                                  "rows; give --dev-data")
        held = set(order[:n_dev].tolist())
        dev = [ex for i, ex in enumerate(train) if i in held]
        train = [ex for i, ex in enumerate(train) if i not in held]
    data = dataclasses.replace(data, train=train, dev=eval_subset(dev, spec.dev_limit))
    metadata = member.inputs.graft_metadata.updated(merge_task=m.name)
    return dataclasses.replace(member, inputs=dataclasses.replace(member.inputs, data=data, data_files=files,
                                                                  graft_metadata=metadata))


def check_data(inputs: list[ModelInput], spec: MergeSpec, mode: str, opened: dict | None = None) -> None:
    """Read every model's data (its --data, --eval-data and --dev-data) before any model loads, as
    :func:`open_member` will: a bad file of the second model is refused before the first one is localized."""
    from skillgraft.models.pair import model_labels  # noqa: PLC0415

    for m in inputs:
        if m.data is None or m.data.data is None:
            continue
        model = (opened or {}).get(m.finetuned)
        labels = model_labels(m.finetuned, ref=model and model.ref) if mode == "classifier" else None
        loaded = m.data.load(labels)
        if labels is not None and len(labels) != loaded.task.num_labels:
            raise SkillgraftError(f"the fine-tuned classifier {m.finetuned} has {len(labels)} outputs but its data "
                                  f"{m.data.data} has {loaded.task.num_labels} labels {list(loaded.task.labels)}")
        if m.dev_data is not None:
            task_labels = tuple(loaded.task.labels) or None
            n_dev = len(m.data.replace(data=m.dev_data, eval_data=m.dev_data, k=None, test_limit=None,
                                       labels=list(task_labels) if task_labels and mode == "generative" else
                                       m.data.labels).load(task_labels if mode == "classifier" else None).test)
        else:
            n_dev = int(round(spec.dev_fraction * len(loaded.train)))
            if n_dev < 1 or n_dev >= len(loaded.train):
                raise SkillgraftError(f"{m.name}: {len(loaded.train)} row(s) of --data cannot give both localization "
                                      "and dev rows; give --dev-data")
        if spec.keep is not None:  # the routed graft's keep search chooses on these dev rows
            from skillgraft.keep.selection import check_keep_rows  # noqa: PLC0415

            check_keep_rows(spec.keep_spec(), loaded.task, min(n_dev, spec.dev_limit or n_dev),
                            f"{m.name}'s dev rows", more="--dev-data FILE")


def task_graft(member: Member, m: ModelInput, spec: MergeSpec, options: Spec, store, *,
               progress: bool = False) -> Graft:
    """The task's graft: the given one, or its region localized at ``spec.budget`` by ``spec.localizer`` with
    ``options`` (its own options spec; from the store when done)."""
    from skillgraft.pipeline.regions import learned_regions  # noqa: PLC0415

    if m.graft is not None:
        g = Graft.from_pretrained(m.graft)
        g.metadata = g.metadata.updated(merge_task=m.name)
        return g
    if "sparsity" in type(options).model_fields and "sparsity" not in options.model_fields_set and \
            spec.budget.fraction:
        options = options.replace(sparsity=spec.budget.fraction)  # γ_base of the budget's size (L&S's init)
    options = options.replace(budgets=[spec.budget])
    regions, _ = learned_regions(member, store, spec.localizer, options, progress=progress)
    region = regions.get(spec.budget) or next(iter(regions.values()))
    meta = {"task": member.task, "mode": member.pre.mode, "localizer": spec.localizer, "budget": spec.budget.key,
            **member.inputs.graft_metadata.to_dict()}
    return Graft.from_models(member.pre, member.ft, region, meta)


def score(scorer, examples) -> float:
    from skillgraft.evaluate.predict import evaluate  # noqa: PLC0415

    return float(evaluate(scorer, examples)[0]["score"])


# ---------------------------------------------------------------------------------------------- the bench
class MergeBench(Workbench):
    """The Workbench as the merge methods see it (:class:`skillgraft.merge.base.Bench`): tasks scored on their own
    rows, with a graft applied or a merged body swapped in."""

    def score(self, use, split: str, names: list[str] | None = None) -> dict[str, float]:
        out = {}
        for name, member in self.members.items():
            if names is not None and name not in names:
                continue
            rows = member.data.dev if split == "dev" else member.test
            with use(name) as scorer:
                out[name] = score(scorer, rows)
        return out

    def grafted(self, graft_of):
        import contextlib  # noqa: PLC0415

        @contextlib.contextmanager
        def use(name):
            member = self.members[name]
            with graft_of(name).applied(member.pre):
                yield member.pre
        return use

    def on_body(self, merged: dict):
        """Each task's θ_pre scorer with the merged body and the task's own head (θ_ft's carried tensors)."""
        import contextlib  # noqa: PLC0415

        from skillgraft.graft.merge import swapped  # noqa: PLC0415
        from skillgraft.merge.mergekit import body_module, body_state  # noqa: PLC0415

        @contextlib.contextmanager
        def use(name):
            pre = self.members[name].pre
            with swapped(pre, self.heads[name]), swapped(body_module(pre), body_state(pre, merged)):
                yield pre
        return use


# ---------------------------------------------------------------------------------------------- the merge
@converts_into_store
def merge_models(pretrained: str, inputs: list[ModelInput], spec: MergeSpec, localize: Spec | dict | None,
                 out: str | os.PathLike, *, store=None, overwrite: bool = False, progress: bool = False,
                 methods: dict[str, MergeMethod] | None = None, runtime=None) -> MergeResult:
    """Merge ``inputs`` (fine-tuned from ``pretrained``) into ``out``; see the module doc. Returns its typed rows
    and merge.json.

    ``localize``: the options of ``spec.localizer`` set by the caller (its own spec or a dict; the rest are
    the localizer's own defaults). ``methods``: the merge methods (default: the registry,
    :func:`skillgraft.merge.merge_methods`; tests pass one with a fake mergekit runner). ``runtime``: where it
    computes (None: the placement the command line activated), passed down to the bench and its loaders.
    """
    from skillgraft.models.placement import boundary  # noqa: PLC0415
    from skillgraft.pipeline.regions import resolve_once  # noqa: PLC0415

    runtime = boundary(runtime)
    from skillgraft.pipeline.store import Store  # noqa: PLC0415

    localize = resolve_once(spec.localizer, localize)  # the command line's, or resolved here: before any work
    check_keep(spec, inputs, localize)
    out = check_target(out, overwrite, merge_inputs(pretrained, inputs, store))
    mode, opened = check_inputs(pretrained, inputs, spec)  # each model opened once, then passed down
    check_data(inputs, spec, mode, opened)  # every model's rows, before the first model loads
    from skillgraft.pipeline.memory_plan import plan_localization  # noqa: PLC0415

    # one θ_ft at a time (lean when its localizer reads files): fits, with candidates auto resolved, or one line
    localize, _ = plan_localization("merge", inputs[0].finetuned if inputs else None, localize,
                                    localizer=spec.localizer, lean=get_localizer(spec.localizer).reads_files,
                                    max_length=spec.max_length, runtime=runtime)
    store = store or Store()
    chosen = [(m, m.options(spec)) for m in (methods or merge_methods()).values()]
    chosen = [(m, o) for m, o in chosen if m.active(o)]
    t0 = time.perf_counter()
    from skillgraft.progress import bar as tqdm  # noqa: PLC0415

    bench = MergeBench(runtime=runtime)
    bench.progress = progress  # merge methods show their own long loops (mergekit's grid) when set
    ft = Scored("fine-tuned", "each task's own model")
    seconds: dict[str, float] = {}
    kept: dict[str, tuple[Graft, dict]] = {}  # --keep: each task's routed graft and its keep search
    with tempfile.TemporaryDirectory(prefix="skillgraft-merge-") as work:
        work = Path(work)
        reads_files = get_localizer(spec.localizer).reads_files
        for m in tqdm(inputs, desc="load, score, localize", unit="model", disable=not progress):  # one θ_ft at a time
            if mode != "classifier":  # a classifier's θ_pre is built on the bench's tensors: read from its files once
                bench.release_pre()  # the member's θ_pre gives the tensors back (share): loaded later when lean
            # a keep search scores θ_ft and θ_pre + γ⊙Δ on the same rows: both in memory (as graft --keep)
            lean = (m.graft is not None or reads_files) and spec.keep is None
            member = open_member(pretrained, m, spec, share_pre=bench.share, lean=lean, runtime=runtime,
                                 opened=(opened[pretrained], opened[m.finetuned]), pre_tensors=bench.pre_tensors())
            bench.add(m.name, member)
            ft.dev[m.name] = score(member.ft, member.data.dev)
            ft.test[m.name] = score(member.ft, member.test)
            bench.scored(m.name)
            for method, opts in chosen:
                method.on_model(bench, m.name, member.ft, opts, work)
            if (m.graft is None and reads_files and spec.keep is None) or member.pre_state == PreState.DEFERRED:
                bench.release_to_files(m.name)  # localized from θ_ft's files: θ_pre and one tensor of θ_ft resident
            bench.load_pre(m.name)  # a lean member: θ_pre after θ_ft's release (docs/scale.md)
            if len(bench.members) == 1:
                for method, opts in chosen:
                    method.start(bench, opts, work)
            bench.set_graft(m.name, task_graft(member, m, spec, localize, store, progress=progress))
            if spec.keep is not None:
                from skillgraft.keep.run import keep_graft  # noqa: PLC0415

                kept[m.name] = keep_graft(member, store, spec.localizer, localize, spec.keep_spec(),
                                          member.inputs.graft_metadata.to_dict(), progress=progress)
            bench.release(m.name)
        t_loc = time.perf_counter() - t0
        results: list[Scored] = [ft, Scored("graft", f"each task's own graft ({spec.budget.label})", stores="graft")]
        own = bench.grafted(lambda n: bench.grafts[n])
        results[1].dev, results[1].test = (bench.score(own, s) for s in ("dev", "test"))
        results[1].reuse = lambda: own
        if kept:
            results.append(routed_keep_row(bench, kept, spec))
        for method, opts in tqdm(chosen, desc="merge methods", unit="method", disable=not progress):
            t1 = time.perf_counter()
            for s in method.rows(bench, opts, ft, work):
                s.source, s.stores = method.name, method.stores  # the report reads the method's metadata
                results.append(s)
            seconds[method.name] = time.perf_counter() - t1
        if spec.refit_heads:
            t1 = time.perf_counter()
            results += refit_rows(bench, results, spec.refit_heads, progress)
            seconds["refit_heads"] = time.perf_counter() - t1
        written, why = pick_written(results, ft)  # the best one-model merge on dev (the stitch on a tie)
        written = written.reuse() if written is not None else None  # in memory: a mergekit body's file goes with work
    summary = summarize(results, ft, bench.members, bench.grafts, spec, mode, pretrained, chosen)
    summary["headline"]["written_why"] = why
    summary["seconds"] = {"localize_and_load": t_loc, "mergekit": seconds.get("mergekit", 0.0),
                          "total": time.perf_counter() - t0}
    summary["placement"] = bench.placement  # where the merge computed (docs/gpu.md)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        if written is not None:  # the best one-model merge on dev (none when no method writes one)
            write_outputs(tmp, bench, written)
        else:
            write_grafts(tmp, bench)
        from skillgraft.merge.mergekit import chosen_yamls  # noqa: PLC0415

        for method, text in chosen_yamls(results, pretrained, [m.finetuned for m in inputs]).items():
            (tmp / "mergekit").mkdir(exist_ok=True)
            (tmp / "mergekit" / f"{method}.yaml").write_text(text)  # the dev-chosen config, for mergekit-yaml
        if spec.routed:
            summary["routed"] = write_routed_outputs(tmp / "routed", bench, summary, kept)
        (tmp / "report.md").write_text(report_markdown(summary, [m for m, _ in chosen])
                                       + f"\nRan on {summary['placement']}.\n")
        rows = summary["rows"]
        summary = {**summary, "rows": [r.columns() for r in rows]}  # merge.json holds their columns
        (tmp / "merge.json").write_text(json.dumps(summary, indent=2, default=float))
        write_csv(tmp / "results.csv", summary["rows"])
        (tmp / "README.md").write_text(readme(summary, mode))
    return MergeResult(Path(out), rows, summary)


def refit_rows(bench: MergeBench, results: list[Scored], n: int, progress: bool = False) -> list[Scored]:
    """Each method's dev-chosen row (and each task's graft alone) with each task's head refitted on ``n`` training
    rows (:mod:`skillgraft.merge.refit`), scored on dev and test."""
    from skillgraft.progress import bar as tqdm  # noqa: PLC0415

    from skillgraft.merge.refit import refit_rows as sample, refitted  # noqa: PLC0415

    rows = {name: sample(member.data.train, n, member.data.seed) for name, member in bench.members.items()}
    out = []
    todo = [s for s in results
            if s.test and s.reuse is not None and (s.info.get("chosen_on_dev") or s.method in ("graft", "routed"))]
    for s in tqdm(todo, desc="refit heads", unit="row",
                  disable=not progress):
        use = refitted(s.reuse(), rows.__getitem__)
        info = {k: v for k, v in s.info.items() if k not in ("written", "writable")}
        r = Scored(s.method, f"{s.config} + refit heads", info={**info, "refit_heads": n,
                                                              "refit_rows": {t: len(x) for t, x in rows.items()}},
                   source=s.source, stores=s.stores)
        r.dev, r.test = bench.score(use, "dev"), bench.score(use, "test")
        out.append(r)
    return out


def check_keep(spec: MergeSpec, inputs: list[ModelInput], options: Spec | None = None) -> None:
    """``--keep`` sizes each routed task's graft: refused, in one line and before any work, without ``--routed``,
    with given ``--grafts`` (nothing to size) or with a localizer that orders no coordinates."""
    if spec.keep is None:
        return
    if not spec.routed:
        raise SkillgraftError(f"--keep {spec.keep:g} sizes each task's routed graft: give --routed with it (the "
                              "stitch and mergekit rows use --budgets)")
    given = [m.name for m in inputs if m.graft is not None]
    if given:
        raise SkillgraftError(f"--keep {spec.keep:g} sizes each task's graft by a search, but --grafts gives "
                              f"{', '.join(given)} fixed: drop one of the two")
    get_localizer(spec.localizer).check_ranked(options)  # with its options: learned's per_size orders nothing


def routed_keep_row(bench: MergeBench, kept: dict[str, tuple[Graft, dict]], spec: MergeSpec) -> Scored:
    """The ``routed`` row of ``--keep``: each task's keep-sized graft alone (its routed model), scored on dev (the
    selection rows) and test, with its own bytes per task."""
    from skillgraft.merge.base import graft_file_bytes  # noqa: PLC0415

    row = Scored("routed", f"keep {spec.keep:g} at {spec.keep_confidence:.0%} confidence",
                 info={"keep": spec.keep, "keep_confidence": spec.keep_confidence,
                       "bytes": {n: graft_file_bytes(g) for n, (g, _) in kept.items()}})
    use = bench.grafted(lambda n: kept[n][0])
    row.dev, row.test = (bench.score(use, s) for s in ("dev", "test"))
    row.reuse = lambda: use
    return row


def write_routed_outputs(folder: Path, bench: MergeBench, summary: dict,
                         kept: dict[str, tuple[Graft, dict]] | None = None) -> dict:
    """``routed/`` (:mod:`skillgraft.graft.routed`) and what the report says of it: each task's graft alone is the
    routed model of that task (the ``graft`` rows; with ``--keep`` the keep-sized grafts of ``kept``, the
    ``routed`` rows, each with its keep search and test share), its bytes, and the switch time of the loader."""
    from skillgraft.graft.routed import RoutedSkills, switch_seconds, write_routed  # noqa: PLC0415

    labels = {n: list(member.data.task.labels) for n, member in bench.members.items()}
    method = "routed" if kept else "graft"
    rows = [r for r in summary["rows"] if r.method == method and r.on_test]  # typed MergeRows
    keep = None
    if kept:
        plain = next(r for r in rows if not r.refit)
        keep = {n: {**{k: v for k, v in k_.items() if k != "probes"}, "test_score": plain.tasks[n].test,
                    "test_share": plain.tasks[n].normalized()} for n, (_, k_) in kept.items()}
    grafts = {n: g for n, (g, _) in kept.items()} if kept else bench.grafts
    words = {n: list(member.data.task.label_words) for n, member in bench.members.items()} \
        if summary["mode"] == "causal" else None  # what RoutedSkills.score reads after a causal skill's prompts
    record = write_routed(folder, bench.pre, grafts, labels, keep, words)
    skills = RoutedSkills.from_pretrained(folder, runtime=bench.runtime)  # the merge's placement
    seconds = switch_seconds(skills)
    router = None
    if summary["settings"].get("router", "auto") != "none":  # fitted on the base as routed/ holds it
        from skillgraft.graft.routed import attach_router  # noqa: PLC0415
        from skillgraft.graft.router import fit_router, member_pairs, member_texts  # noqa: PLC0415

        router = fit_router(skills, {n: member_texts(m, "train", summary["mode"]) for n, m in bench.members.items()},
                            {n: member_texts(m, "dev", summary["mode"]) for n, m in bench.members.items()},
                            summary["settings"].get("router", "auto"),
                            pairs={n: member_pairs(m, summary["mode"]) for n, m in bench.members.items()})
        attach_router(folder, router)
    ckpt = summary["headline"]["checkpoint_bytes"]
    out = {"folder": "routed", "switch_ms": 1e3 * seconds,
           "bytes_per_task": float(np.mean([t["bytes"] for t in record["tasks"].values()])),
           "tasks": {n: t["bytes"] for n, t in record["tasks"].items()}}
    out["share_of_checkpoint"] = out["bytes_per_task"] / ckpt if ckpt else None
    if router is not None:
        out["router"] = {"kind": router.kind, **router.info}
    for r in rows:
        out["mean_normalized_refit" if r.refit else "mean_normalized"] = r.mean_normalized()
    if kept:
        out.update(keep_target=summary["settings"]["keep"], keep_confidence=summary["settings"]["keep_confidence"],
                   keep={n: {**kept[n][1], **k, "bytes": record["tasks"][n]["bytes"]} for n, k in keep.items()})
    return out


def run_merge(*, pretrained: str | None, finetuned: list[str], data: list[str], eval_data: list[str],
              dev_data: list[str], grafts: list[str], names: list[str], shared, spec: MergeSpec, localize,
              out: str | os.PathLike, cache: str | os.PathLike | None = None, overwrite: bool = False,
              mergekit_runner=None, progress: bool = False) -> MergeResult:
    """``skillgraft merge`` from its option lists (one entry per model, :func:`resolve_inputs`; ``shared``: the
    ``UserDataSpec`` every model's data shares): the output folder checked, the store at ``cache`` opened, then
    :func:`merge_models`. ``mergekit_runner``: a stand-in for mergekit (tests)."""
    from skillgraft.heap import return_large_blocks  # noqa: PLC0415
    from skillgraft.pipeline.store import Store  # noqa: PLC0415

    return_large_blocks()  # freed θ_pre copies and released θ_ft go back to the OS at once (bench/merge_memory.py)
    check_target(out, overwrite)
    pretrained, inputs = resolve_inputs(pretrained=pretrained, finetuned=finetuned, data=data, eval_data=eval_data,
                                        dev_data=dev_data, grafts=grafts, shared=shared, names=names)
    return merge_models(pretrained, inputs, spec, localize, out, store=Store(cache), overwrite=overwrite,
                        progress=progress, methods=merge_methods(mergekit_runner=mergekit_runner))
