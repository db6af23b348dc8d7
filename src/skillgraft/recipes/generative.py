"""The grafting paper's question on a generative model: SFT on prompt → completion pairs, and the share of the
completion-loss drop a graft recovers.

For each task and data seed, the LM-BFF k-shot draw of a registered task becomes prompt → completion pairs:
the prompt is the task's causal template up to its label slot (``"<text> It was"``, ``"<text> Topic:"``) or
a format of ``prompts``, the completion the label's word (``" great"``, ``" Sports"``) or ``completions``,
followed by EOS. The model is fine-tuned on the completion loss (docs/generative.md),

    ℓ(x) = −(1/n) Σ_j log p_θ(c_j | p, c_<j),   L = mean of ℓ over examples,

with the recipe's ``finetune`` (SGD / AdamW, lr, steps, frozen embeddings; best dev exact match kept), then
every localizer of ``localizers`` finds a region per budget with the same loss (learned: paper Eq. 3–4;
top-|Δ|; random), and θ_pre, θ_ft and every graft θ_pre + γ ⊙ (θ_ft − θ_pre) are scored on the held-out
pairs: completion loss L, the **share of the loss drop recovered** (L_pre − L_graft) / (L_pre − L_ft), exact
match (the gold completion ranks first among the label completions), token accuracy, ECE and agreement with FT.

Stages live in the store (the fine-tuning "generative-ft", the regions cache, the rows "generative-rows"), so an
interrupted run resumes after its last finished stage. Writes ``results.csv``, ``summary.csv``,
``localizers.csv`` and ``report.md``.
"""

from __future__ import annotations

import string
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from skillgraft.data import get_task
from skillgraft.data.loading import Example
from skillgraft.data.sampling import FewShotData
from skillgraft.data.user import GenerativeTask
from skillgraft.errors import SkillgraftError
from skillgraft.graft.selection import Budget
from skillgraft.io import write_json
from skillgraft.untrusted import read_json
from skillgraft.models.scorer import Scorer, build_scorer
from skillgraft.models.templates import template_text
from skillgraft.pipeline.regions import learned_regions
from skillgraft.pipeline.report import RunDir, md_table, pct
from skillgraft.pipeline.member import Member, MemberInputs, scorer_digest
from skillgraft.pipeline.store import draw_key, precision_key
from skillgraft.pipeline.variants import base_variants, compare, graft_variant
from skillgraft.recipes.base import (ExperimentSpec, LocalizerRun, SeedsMixin, check_localizer_runs, recipe,
                                     size_budgets)
from skillgraft.train import finetune

METRICS = ["loss", "loss_recovered", "exact_match", "token_accuracy", "ece", "agreement", "share_of_ft"]
_FIELDS = {"text", "text_b"}


def _default_localizers() -> list[LocalizerRun]:
    return [LocalizerRun(name="learned", label="paper (learned)", options={"steps": 30, "eval_every": 10}),
            LocalizerRun(name="movement", label="top-|Δ|"), LocalizerRun(name="random", label="random")]


class GenerativeSpec(ExperimentSpec, SeedsMixin):
    """SFT of a causal LM on prompt → completion pairs built from registered tasks; grafts at ``budgets``."""

    model: str = Field(description="a causal LM: hub name, local folder or GGUF file (e.g. gemma-3-270m)")
    mode: Literal["causal"] = Field("causal", description="a causal LM (the pairs are scored as generative data)")
    prompts: dict[str, str] = Field(default_factory=dict, description=(
        "task → prompt format with {text} (and {text_b} for pair tasks) (default: the task's causal template up to "
        "its label slot, e.g. '{text} It was')"))
    completions: dict[str, list[str]] = Field(default_factory=dict, description=(
        "task → the completion of each label, in the task's label order (default: its label words with a leading "
        "space, e.g. [' terrible', ' great'])"))
    exact_match: bool = Field(True, description=(
        "rank the label completions after every held-out prompt: exact match, ECE, agreement (num_labels more "
        "forward passes per example); false: open-ended scoring, token accuracy only"))
    budgets: list[Budget] = Field(default_factory=lambda: [Budget.parse(x) for x in (1e-4, 1e-3)], min_length=1,
                                  description="graft sizes, fractions of the body (or counts)")
    localizers: list[LocalizerRun] = Field(default_factory=_default_localizers, min_length=1, description=(
        "localizers compared at every budget (the completion loss is their objective); the first is the reference"))

    @field_validator("budgets", mode="before")
    @classmethod
    def _budgets(cls, v):
        return size_budgets(v)

    @model_validator(mode="after")
    def _check(self):
        check_localizer_runs(self.localizers, lambda loc: loc.resolved(self.budgets))
        try:
            names = {get_task(t).name for t in self.tasks}
            for field in ("prompts", "completions"):
                for t in getattr(self, field):
                    if get_task(t).name not in names:
                        raise SkillgraftError(f"{field}.{t}: not among the recipe's tasks {sorted(names)}")
        except SkillgraftError as e:
            raise ValueError(str(e)) from None
        for t, fmt in self.prompts.items():
            try:
                used = {f for _, f, _, _ in string.Formatter().parse(fmt) if f is not None}
            except ValueError as e:
                raise ValueError(f"prompts.{t}: {fmt!r} is not a format string ({e})") from None
            if used - _FIELDS or "text" not in used:
                raise ValueError(f"prompts.{t}: {fmt!r} must use {{text}} (and may use {{text_b}}), got "
                                 f"{sorted(used)}")
        for t, words in self.completions.items():
            task = get_task(t)
            if len(words) != task.num_labels or len(set(words)) != len(words) or not all(w.strip() for w in words):
                raise ValueError(f"completions.{t}: needs {task.num_labels} distinct non-empty completions (one per "
                                 f"label {list(task.labels)}), got {words}")
        return self

    def pairs_of(self, task: str) -> dict:
        """How ``task``'s examples become pairs: the prompt format (None: the causal template) and completions."""
        t = get_task(task)
        prompt = next((v for k, v in self.prompts.items() if get_task(k).name == t.name), None)
        words = next((v for k, v in self.completions.items() if get_task(k).name == t.name), None)
        return {"prompt": prompt, "completions": words or [" " + w for w in t.label_words],
                "exact_match": self.exact_match}


def to_pairs(task, examples: list[Example], pairs: dict) -> list[Example]:
    """Generative examples (prompt, label index, completion) of classification ``examples``."""
    template = task.causal_template or task.template
    out = []
    for ex in examples:
        if pairs["prompt"] is None:
            prompt = template_text(template, ex)
        else:
            prompt = pairs["prompt"].format(text=ex.text_a, text_b=ex.text_b or "")
        out.append(Example(prompt, ex.label, pairs["completions"][ex.label]))
    return out


def pair_data(spec: GenerativeSpec, task: str, seed: int) -> tuple[FewShotData, dict]:
    """The k-shot draw of ``task`` at ``seed`` as prompt → completion pairs, and how they were built."""
    few = spec.data_spec(task, seed).load()
    pairs = spec.pairs_of(task)
    gtask = GenerativeTask.make(few.task.name, tuple(pairs["completions"]) if spec.exact_match else ())
    data = FewShotData(gtask, few.k, few.seed, *(to_pairs(few.task, s, pairs) for s in (few.train, few.dev, few.test)))
    return data, pairs


def generative_member(spec: GenerativeSpec, run: RunDir, task: str, seed: int, timing: dict, *,
                     stored_only: bool = False) -> tuple[Member, dict]:
    """θ_pre and θ_ft (SFT on the pairs; the store's "generative-ft" entry) on one draw, and FT's training record.
    ``stored_only``: refuse (one line) when the store does not hold the fine-tuning, instead of training it."""
    data, pairs = pair_data(spec, task, seed)
    data_spec = spec.data_spec(task, seed)
    key = {**draw_key(spec.model_spec(), data_spec), "pairs": pairs, "finetune": spec.finetune.to_dict(),
           **precision_key(run.runtime)}  # a bf16 SFT is its own entry
    label = f"{data.task.name}-{data.k}-{seed}-generative"
    if stored_only and run.store.get("generative-ft", key, label) is None:
        raise SkillgraftError(f"the store {run.store.root} holds no generative fine-tuning of {data.task.name} "
                              f"(k {data.k}, seed {seed}) with these settings: run the recipe first")

    def pre_scorer() -> Scorer:
        return build_scorer(spec.model, data.task, "generative", max_length=spec.max_length).eval()

    holder: dict = {}

    def make(folder: Path) -> None:
        scorer = pre_scorer()
        res = finetune(scorer, data.train, data.dev, spec.finetune, k=data.k, progress=spec.progress)
        res.model.save_pretrained(folder / "model")
        write_json(folder / "metrics.json", {
            "steps": res.steps, "best_step": res.best_step, "best_dev": res.best_dev, "history": res.history,
            "train_seconds": round(res.seconds, 2), "train_examples_per_second": round(res.examples_per_second, 2),
            "trainable_parameters": res.trainable_parameters})
        holder["ft"] = res.model

    t0 = time.perf_counter()
    entry = run.store.fetch("generative-ft", key, make, label=label)
    record = read_json(entry / "metrics.json", required=("trainable_parameters",), what="stored SFT metrics")
    ft = holder.get("ft") or Scorer.from_pretrained(entry / "model", task=data.task).eval()
    timing["fine-tuning"] = round(time.perf_counter() - t0, 1)
    timing["fine-tuning (computed)"] = record.get("train_seconds")
    pre = pre_scorer()
    identity = {"finetuned": scorer_digest(ft), "pretrained": scorer_digest(pre), "mode": "generative",
                "data": {"draw": key["data"], "data_digest": key["data_digest"], "pairs": pairs,
                         "test_n": len(data.test)},
                **precision_key(run.runtime)}  # as Member.identity(): a bf16 run's rows are its own entries
    inputs = MemberInputs(data, entry, None, data_root=str(spec.data_dir) if spec.data_dir else None)
    member = Member(data.task.name, inputs, ft, pre, _identity=identity)
    return member, record


def draw_rows(spec: GenerativeSpec, member: Member, record: dict, run: RunDir, timing: dict) -> list[dict]:
    """Rows of one (task, seed): pre-trained, FT and every localizer's graft at every budget (stored)."""
    key = {"setup": member.identity(), "budgets": [b.key for b in spec.budgets],
           "localizers": [{"name": loc.name, "label": loc.title, "options": loc.resolved(spec.budgets).to_dict()}
                          for loc in spec.localizers]}
    holder: dict = {}

    def make(folder: Path) -> None:
        variants = base_variants(member)
        for v in variants:
            if v.kind == "ft":  # what SFT trained (the frozen embeddings and the tied head not counted)
                v.params = int(record["trainable_parameters"])
        for loc in spec.localizers:
            t0 = time.perf_counter()
            regions, summary = learned_regions(member, run.store, loc.name, loc.resolved(spec.budgets),
                                               progress=spec.progress)
            timing[f"regions {loc.title}"] = round(time.perf_counter() - t0, 1)
            for budget in (b for b in spec.budgets if b in regions):
                v = graft_variant(member, regions[budget], budget, {"localizer": loc.name},
                                  name=f"{loc.title} {budget.label}")
                v.info = {"localizer": loc.title, "budget": budget.label,
                          "best_step": (summary.get("best_step") or {}).get(budget.key)}
                variants.append(v)
        t0 = time.perf_counter()
        rows, _ = compare(member, variants, progress=spec.progress)
        timing["evaluation"] = round(time.perf_counter() - t0, 1)
        info = {v.name: v.info for v in variants}
        out = [{"task": member.task, "seed": member.seed, **r, **info.get(r["model"], {})} for r in rows]
        write_json(folder / "rows.json", {"rows": out, "timing": timing})
        holder["rows"] = out

    entry = run.store.fetch("generative-rows", key, make, label=f"{member.task}-{member.k}-{member.seed}-generative")
    if "rows" in holder:
        return holder["rows"]
    stored = read_json(entry / "rows.json", required=("rows",), what="stored generative rows")
    timing.update({f"{k} (stored run)": v for k, v in (stored.get("timing") or {}).items()})
    return stored["rows"]


@recipe("generative", GenerativeSpec)
def generative(spec: GenerativeSpec, run: RunDir) -> dict:
    for task in spec.tasks:  # every draw loads (and every pair is built) before any work
        for seed in spec.seeds:
            pair_data(spec, task, seed)
    rows, timings = [], []
    for task in spec.tasks:
        for seed in spec.seeds:
            t0 = time.perf_counter()
            timing = {"task": get_task(task).name, "seed": seed}
            member, record = generative_member(spec, run, task, seed, timing)
            rows += draw_rows(spec, member, record, run, timing)
            timing["total"] = round(time.perf_counter() - t0, 1)
            timings.append(timing)
            del member
    agg, _ = run.seed_tables("results.csv", rows, ["task", "model", "kind", "localizer", "budget"],
                             METRICS + ["params", "density"])
    table = localizer_table(spec, rows)
    run.csv("localizers.csv", table)
    run.report(report_markdown(spec, agg, table, timings))
    return {"rows": rows, "localizers": table, "timings": timings}


def localizer_table(spec: GenerativeSpec, rows: list[dict]) -> list[dict]:
    """Per localizer × budget: mean over tasks (each the mean over its seeds) of the loss drop recovered, exact
    match and its share of FT's."""
    out = []
    for budget in spec.budgets:
        for loc in spec.localizers:
            name = f"{loc.title} {budget.label}"
            mine = [r for r in rows if r["model"] == name]
            if not mine:
                continue
            per_task = {}
            for col in ("loss_recovered", "exact_match", "share_of_ft"):
                by = {}
                for r in mine:
                    if r.get(col) is not None:
                        by.setdefault(r["task"], []).append(r[col])
                per_task[col] = float(np.mean([np.mean(v) for v in by.values()])) if by else None
            out.append({"localizer": loc.title, "budget": budget.label, "params": mine[0]["params"],
                        "tasks": len({r["task"] for r in mine}), **per_task})
    return out


def _num(values, digits: int = 3) -> str:
    arr = np.asarray([v for v in (values or []) if v is not None and not np.isnan(v)], dtype=float)
    if not arr.size:
        return "-"
    return f"{arr.mean():.{digits}f} ({arr.std():.{digits}f})" if arr.size > 1 else f"{arr.mean():.{digits}f}"


def report_markdown(spec: GenerativeSpec, agg: list[dict], table: list[dict], timings: list[dict]) -> str:
    ft = spec.finetune
    lines = ["# Grafting a generative SFT: the share of the completion-loss drop a graft recovers", "",
             f"Model {spec.model}, prompt → completion pairs from k={spec.k} per label (LM-BFF draw), data seeds "
             f"{spec.seeds}, {spec.test_limit or 'all'} held-out test pairs (seeded sample). SFT: "
             f"{ft.optimizer.upper()} lr {ft.lr:g}, {ft.steps or f'16·n·k ≤ {ft.max_steps}'} steps, batch "
             f"{ft.batch_size}, embeddings {'frozen' if ft.freeze_embeddings else 'trained'}. Grafts at "
             f"{', '.join(b.label for b in spec.budgets)} of the body.", "",
             "Completion loss L = mean over examples of the mean token cross-entropy of the completion (+ EOS); "
             "loss drop recovered = (L_pre − L) / (L_pre − L_FT); exact match = the gold completion ranks first "
             "among the label completions (summed log-probability); token accuracy: teacher-forced next-token "
             "accuracy on completion tokens. Mean (std) over data seeds; percentages except L.", ""]
    for task in spec.tasks:
        name, pairs = get_task(task).name, spec.pairs_of(task)
        group = [g for g in agg if g["task"] == name]
        if not group:
            continue
        prompt = pairs["prompt"] or template_text(get_task(task).causal_template or get_task(task).template,
                                                  Example("{text}", 0, "{text_b}"))
        lines += [f"## {name}", "", f"Prompt {prompt!r}, completions {pairs['completions']}.", "",
                  md_table(["model", "params", "completion loss", "loss drop recovered", "exact match",
                            "token accuracy", "ECE", "agreement w/ FT"],
                           [[g["model"], int(g["params"][0]) if g["params"] else 0, _num(g["loss"]),
                             pct(g["loss_recovered"]), pct(g["exact_match"]), pct(g["token_accuracy"]),
                             pct(g["ece"]), pct(g["agreement"])] for g in group]), ""]
    lines += ["## Localizers at equal size", "",
              "Mean over tasks (each task: the mean over its seeds).", "",
              md_table(["localizer", "budget", "params", "tasks", "loss drop recovered", "exact match",
                        "share of FT's exact match"],
                       [[t["localizer"], t["budget"], t["params"], t["tasks"], pct(t["loss_recovered"]),
                         pct(t["exact_match"]), pct(t["share_of_ft"])] for t in table]), ""]
    stages = list(dict.fromkeys(k for t in timings for k in t if k not in ("task", "seed")))
    lines += ["## Wall time (seconds)", "",
              "'(computed)': when the stage was computed (it may come from the store now); '(stored run)': the "
              "stage times of the run that stored the rows.", "",
              md_table(["task", "seed", *stages], [[t["task"], t["seed"], *(t.get(s, "-") for s in stages)]
                                                   for t in timings]), ""]
    return "\n".join(lines)

