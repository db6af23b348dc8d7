"""mergekit's dense merges (``linear``, ``task_arithmetic``, ``ties``, ``dare_ties``) as a merge method, run through
``mergekit-yaml`` on the same checkpoints: each method's documented defaults (weight 1, every other parameter
mergekit's default) and a grid of λ / density chosen on dev rows. Heads of tasks with different label sets cannot be
merged, so every method merges the *body* (all but the task head) and each task runs on it with its own head.

The runner is injectable: ``Mergekit(runner=fake)`` (tests stand in a function for the ``mergekit-yaml`` process).
Each merged state is kept on disk between its dev and test scoring, so one merged body is in memory at a time.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from skillgraft.errors import SkillgraftError
from skillgraft.merge.base import Bench, MergeMethod, MergeRow, Scored, best_row, fmt
from skillgraft.spec import Spec

METHODS = ("linear", "task_arithmetic", "ties", "dare_ties")
Runner = Callable[[str, Path, int], dict]  # (mergekit YAML, work folder, seed) → merged tensors


GRID_SCALES = (0.3, 0.5, 1.0, 1.5)  # --mergekit-grid's λ grid unless --scales says one
GRID_DENSITIES = (0.1, 0.2, 0.5)  # --mergekit-grid's density grid unless --densities says one


class MergekitOptions(Spec):
    """mergekit's options (fields of ``skillgraft merge``). By default each method runs once, at mergekit's own
    defaults (4 merges); the λ / density grid chosen on dev is opt-in (``--mergekit-grid``, or a ``--scales`` /
    ``--densities`` grid given): 27 more merges at the default grid, all in one mergekit process
    (:class:`MergekitWorker`)."""

    mergekit: list[Literal[METHODS]] = Field(default_factory=lambda: list(METHODS),
                                             description="mergekit methods to compare (empty: none)")
    mergekit_grid: bool = Field(False, description=(
        "also choose each mergekit method's λ (and density) on dev from a grid: 27 more mergekit merges for the "
        "four methods, each scored on every task's dev rows (off: one merge per method, at mergekit's defaults); "
        "on when --scales or --densities is given"))
    scales: list[float] | None = Field(None, description="λ grid of task_arithmetic, ties and dare_ties (chosen on "
                                                         "dev rows; turns the grid on; default with --mergekit-grid: "
                                                         "0.3,0.5,1,1.5)")
    densities: list[float] | None = Field(None, description="density grid of ties and dare_ties (chosen on dev rows; "
                                                            "turns the grid on; default with --mergekit-grid: "
                                                            "0.1,0.2,0.5)")
    random_seed: int = Field(0, description="seed of mergekit's random pruning (dare_ties)")

    @field_validator("scales", "densities")
    @classmethod
    def _positive(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and any(x <= 0 for x in v):
            raise ValueError(f"values must be > 0, got {v}")
        return v

    @field_validator("densities")
    @classmethod
    def _at_most_one(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and any(x > 1 for x in v):
            raise ValueError(f"densities are fractions in (0, 1], got {v}")
        return v

    @property
    def grid(self) -> bool:
        """Whether the λ / density grid runs (opt-in)."""
        return self.mergekit_grid or bool(self.scales) or bool(self.densities)

    def runs(self) -> int:
        """How many ``mergekit-yaml`` runs these options ask for (what the plan line states up front)."""
        return len(mergekit_configs(self))


def mergekit_configs(spec: MergekitOptions) -> list[tuple[str, str, dict, dict]]:
    """(method, label, per-model parameters, global parameters): each method's defaults, then (opt-in) the grid."""
    scales = list(spec.scales or (GRID_SCALES if spec.grid else ()))
    densities = list(spec.densities or (GRID_DENSITIES if spec.grid else ()))
    out = []
    for method in spec.mergekit:
        out.append((method, "defaults", {"weight": 1.0}, {}))
        if not spec.grid:
            continue
        if method == "task_arithmetic":
            out += [(method, f"λ={s:g}", {"weight": 1.0}, {"lambda": s}) for s in scales if s != 1.0]
        elif method in ("ties", "dare_ties"):
            out += [(method, f"density={d:g} λ={s:g}", {"weight": 1.0, "density": d}, {"lambda": s})
                    for d in densities or [1.0] for s in scales or [1.0]]
    return out


def body_module(scorer):
    """What every method merges: the model without its task head (``base_model``) when it has one, else all."""
    from skillgraft.models.anatomy import carried_names  # noqa: PLC0415

    return scorer.model.base_model if carried_names(scorer) else scorer.model



def mergekit_yaml(method: str, base: Path, models: list[Path], params: dict, global_params: dict) -> str:
    """A mergekit-yaml config (absolute paths); ``linear`` has no base model."""
    import yaml  # noqa: PLC0415

    cfg = {"merge_method": method, "models": [{"model": str(p.resolve()), "parameters": dict(params)} for p in models],
           "dtype": "float32"}
    if method != "linear":
        cfg["base_model"] = str(base.resolve())
    if global_params:
        cfg["parameters"] = global_params
    return yaml.safe_dump(cfg, sort_keys=False)


def chosen_yamls(results: list[Scored], pretrained: str, finetuned: list[str]) -> dict[str, str]:
    """``{method: mergekit YAML}`` of each mergekit method's dev-chosen configuration, on the user's own checkpoints:
    what ``skillgraft merge`` saves as ``mergekit/<method>.yaml`` for re-use with ``mergekit-yaml``."""
    out = {}
    for s in results:
        if s.method.startswith("mergekit ") and s.info.get("chosen_on_dev") and s.test:
            method = s.method.removeprefix("mergekit ")
            params, global_params = explicit(method, s.info["parameters"], s.info["global"])
            local = [Path(p) if Path(p).exists() else None for p in [pretrained, *finetuned]]
            if any(p is None for p in local):  # hub names: mergekit takes them as they are
                text = mergekit_yaml(method, Path(pretrained), [Path(p) for p in finetuned], params,
                                     global_params).replace(str(Path(pretrained).resolve()), pretrained)
                for p in finetuned:
                    text = text.replace(str(Path(p).resolve()), p)
            else:
                text = mergekit_yaml(method, local[0], local[1:], params, global_params)
            chosen = s.config if s.config != "defaults" else "mergekit's defaults, written out; they scored best on dev"
            out[method] = (f"# mergekit {method} at the configuration skillgraft merge chose on dev rows "
                           f"({chosen});\n# skillgraft merged the bodies only (each task kept its own head): run "
                           "as is on checkpoints\n# whose heads agree, e.g. `mergekit-yaml this.yaml merged/`\n" + text)
    return out


# mergekit's own defaults of the parameters skillgraft varies (mergekit/merge_methods/generalized_task_arithmetic.py)
MERGEKIT_DEFAULTS = {"density": 1.0, "lambda": 1.0}


def explicit(method: str, params: dict, global_params: dict) -> tuple[dict, dict]:
    """A configuration with every parameter skillgraft varies written out (mergekit's default where the grid left it
    unset): a saved ``ties.yaml`` always states its density and λ, never leaves them to whoever reads it."""
    params, global_params = dict(params), dict(global_params)
    if method in ("ties", "dare_ties"):
        params.setdefault("density", MERGEKIT_DEFAULTS["density"])
    if method in ("task_arithmetic", "ties", "dare_ties"):
        global_params.setdefault("lambda", MERGEKIT_DEFAULTS["lambda"])
    return params, global_params


# One process runs every mergekit merge of a run (mergekit's imports cost ≈ 8 s of CPU each time a mergekit-yaml
# process starts: 31 starts were 4 minutes of a 2-core machine's time): it reads "config<TAB>out<TAB>seed" lines
# and runs each as `mergekit-yaml config out --no-copy-tokenizer --no-write-model-card --random-seed seed --quiet`.
_WORKER = r"""
import sys, traceback
import yaml
from mergekit.config import MergeConfiguration
from mergekit.merge import run_merge
from mergekit.options import MergeOptions
print("\0skillgraft ready", flush=True)
for line in sys.stdin:
    config, out, seed = line.rstrip("\n").split("\t")
    try:
        options = MergeOptions(copy_tokenizer=False, write_model_card=False, random_seed=int(seed), quiet=True)
        options.apply_global_options()
        text = open(config, encoding="utf-8").read()
        run_merge(MergeConfiguration.model_validate(yaml.safe_load(text)), out, options=options, config_source=text)
        print("\0skillgraft ok", flush=True)
    except Exception as e:
        traceback.print_exc()
        lines = [x for x in str(e).strip().splitlines() if x.strip()] or [type(e).__name__]
        print("\0skillgraft error " + type(e).__name__ + ": " + lines[-1], flush=True)
"""
_MARK = "\0skillgraft "


class MergekitWorker:
    """``mergekit-yaml``'s work in one long-lived process for a whole run (a :data:`Runner`; :meth:`close` ends it):
    mergekit is imported once, not once per grid point. Each merge's output folder is read and removed."""

    def __init__(self):
        self.proc = None
        self.log = None

    def _start(self, work: Path):
        import importlib.util  # noqa: PLC0415

        if importlib.util.find_spec("mergekit") is None:
            raise SkillgraftError("mergekit not found (mergekit is pinned in requirements.lock: run `make setup`), or "
                                  "pass --mergekit ''")
        self.log = open(work / "mergekit.log", "w+", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, bufsize=1)
        self._answer()

    def _answer(self) -> str:
        for line in self.proc.stdout:
            if line.startswith(_MARK):
                return line[len(_MARK):].rstrip("\n")
        self.proc.wait()
        self.log.seek(0)
        lines = [x for x in self.log.read().strip().splitlines() if x.strip()]
        self.proc = None
        raise SkillgraftError(f"mergekit-yaml failed: {lines[-1] if lines else 'its process ended'}")

    def __call__(self, config: str, work: Path, seed: int) -> dict:
        from safetensors.torch import load_file  # noqa: PLC0415

        if self.proc is None:
            self._start(work)
        (work / "merge.yml").write_text(config)
        out = work / "merged"
        shutil.rmtree(out, ignore_errors=True)
        self.proc.stdin.write(f"{work / 'merge.yml'}\t{out}\t{seed}\n")
        self.proc.stdin.flush()
        answer = self._answer()
        if answer != "ok":
            raise SkillgraftError(f"mergekit-yaml failed: {answer.removeprefix('error ')}")
        state: dict = {}
        for f in sorted(out.glob("*.safetensors")):
            state.update(load_file(str(f)))
        shutil.rmtree(out, ignore_errors=True)
        return state

    def kill(self) -> None:
        """End the process at once (an interrupted run)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def close(self) -> None:
        """End the process once its merges are done (its input closed) and the log."""
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None


def run_mergekit(config: str, work: Path, seed: int) -> dict:
    """Run ``mergekit-yaml``'s merge of ``config`` once (its own process); the merged tensors."""
    worker = MergekitWorker()
    try:
        return worker(config, work, seed)
    finally:
        worker.close()


def mergekit_input(scorer, folder: Path) -> None:
    """Write what mergekit merges for ``scorer``: the whole model, or (a model with a task head) its body inside
    a two-output classifier of the model's own class whose head is all zeros — the same in every input, so it
    merges to itself and is dropped. (A body saved alone as ``BertModel`` crashes mergekit 0.1.5's planner on
    its optional aliased ``position_ids``; its ``…ForSequenceClassification`` definitions work.)"""
    import copy  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from skillgraft.models.anatomy import carried_names  # noqa: PLC0415
    from skillgraft.models.pair import torch_fork  # noqa: PLC0415

    model = scorer.model
    if not carried_names(scorer):
        arch = model.config.architectures
        try:
            model.save_pretrained(folder)
        finally:
            model.config.architectures = arch  # save_pretrained writes the class name into the shared config
        return
    cfg = copy.deepcopy(model.config)
    cfg.num_labels, cfg.problem_type = 2, None
    with torch_fork(0):
        container = type(model)(cfg)
    container.base_model.load_state_dict(body_module(scorer).state_dict())
    body = {id(p) for p in container.base_model.parameters()}
    with torch.no_grad():
        for p in container.parameters():
            if id(p) not in body:
                p.zero_()
    container.save_pretrained(folder)


def body_state(scorer, merged: dict) -> dict:
    """The merged tensors for :func:`body_module` of ``scorer`` (read from :func:`mergekit_input`'s layout), less
    its carried head tensors (a pooler only the fine-tuned checkpoints have stays each task's own, as in the
    stitch). Every other parameter of the body must be merged."""
    from skillgraft.models.anatomy import carried_names  # noqa: PLC0415
    from skillgraft.models.families import body_prefix  # noqa: PLC0415

    module = body_module(scorer)
    carried_list = carried_names(scorer)
    if carried_list:
        prefix = body_prefix(scorer.model) + "."  # the family table
        merged = {n[len(prefix):]: t for n, t in merged.items() if n.startswith(prefix)}
    own = module.state_dict()
    params = dict(scorer.named_parameters())
    carried = {id(params[n]) for n in carried_list}
    body = [n for n, p in module.named_parameters() if id(p) not in carried]
    missing = [n for n in body if n not in merged]
    if missing:
        raise SkillgraftError(f"the merged model lacks {len(missing)} tensor(s) of the body, e.g. {missing[:3]}")
    skip = {n for n, p in module.named_parameters() if id(p) in carried}
    return {n: t for n, t in merged.items() if n in own and n not in skip}


class Mergekit(MergeMethod):
    """mergekit's methods on the bodies; ``runner`` runs one YAML (default: the ``mergekit-yaml`` process)."""

    summary = "mergekit's linear / task_arithmetic / ties / dare_ties on the same checkpoints (grid chosen on dev)"
    Options = MergekitOptions
    grid_note = "mergekit: λ = `lambda`, weight 1 per model"
    legend = ("mergekit: `linear` = mean of the fine-tuned bodies; `task_arithmetic` = θ_pre + λ Σ_t τ_t; `ties` = "
              "trim to the top-density |τ|, elect signs, mean of the agreeing values, × λ; `dare_ties` = random drop "
              "to density with rescaling, sign election, sum × λ. *defaults*: weight 1 per model and mergekit's own "
              "defaults (λ 1, density 1).")

    def headline(self, rows: list[MergeRow], options: MergekitOptions) -> dict:
        """Its best method on test (each method's settings chosen on dev); with refitted heads, the same refitted."""
        mine = [r for r in rows if r.source == self.name]
        best = best_row([r for r in mine if r.chosen_on_dev])
        out = {"best_mergekit": f"{best.method} ({best.config})" if best else None,
               "best_mergekit_mean_normalized": best.mean_normalized() if best else None}
        if any(r.refit for r in rows):
            refit = best_row([r for r in mine if r.chosen_on_dev], refit=True)
            out.update(best_mergekit_refit=f"{refit.method} ({refit.config})" if refit else None,
                       best_mergekit_refit_mean_normalized=refit.mean_normalized() if refit else None)
        return out

    def headline_lines(self, h: dict) -> list[str]:
        lines = []
        if h.get("best_mergekit"):
            lines.append(f"- best mergekit method (its settings chosen on dev, best of the methods on test): "
                         f"{h['best_mergekit']}: {fmt(h['best_mergekit_mean_normalized'])}")
        if h.get("refit_heads") and h.get("best_mergekit_refit"):
            lines.append(f"- with heads refitted on {h['refit_heads']} rows per task: best mergekit method "
                         f"{h['best_mergekit_refit']}: {fmt(h['best_mergekit_refit_mean_normalized'])}")
        return lines

    def __init__(self, runner: Runner | None = None):
        self.runner = runner  # None: one MergekitWorker per run of rows()

    def active(self, options: MergekitOptions) -> bool:
        return bool(options.mergekit)

    def start(self, bench: Bench, options: MergekitOptions, work: Path) -> None:
        mergekit_input(bench.pre_scorer(), work / "mergekit" / "base")

    def on_model(self, bench: Bench, name: str, ft, options: MergekitOptions, work: Path) -> None:
        mergekit_input(ft, work / "mergekit" / f"ft{bench.names.index(name)}")

    def rows(self, bench: Bench, options: MergekitOptions, ft: Scored, work: Path) -> list[Scored]:
        """Every config scored on dev; per method its defaults and its dev-best config also on test."""
        root = work / "mergekit"
        dirs = [root / "base", *[root / f"ft{i}" for i in range(len(bench.names))]]
        kept: dict[tuple[str, str], Path] = {}  # merged states that may still be scored on test, on disk
        configs = mergekit_configs(options)
        runner = self.runner or MergekitWorker()  # mergekit imported once for the whole grid
        try:
            scored = self._grid(bench, options, ft, configs, runner, root, dirs, kept)
        except BaseException:  # Ctrl-C, SIGTERM, a failure: the process stops now, not after its current merge
            getattr(runner, "kill", lambda: None)()
            raise
        finally:
            getattr(runner, "close", lambda: None)()
        return self._on_test(bench, options, ft, scored, kept)

    def _grid(self, bench, options, ft, configs, runner, root, dirs, kept) -> list[Scored]:
        """Every configuration merged and scored on dev; what may still be scored on test kept on disk."""
        from safetensors.torch import save_file  # noqa: PLC0415

        from skillgraft.progress import bar as tqdm  # noqa: PLC0415

        scored: list[Scored] = []
        for method, label, params, global_params in tqdm(configs, desc="mergekit grid", unit="merge", leave=False,
                                                          disable=not getattr(bench, "progress", False)):
            s = Scored(f"mergekit {method}", label, info={"parameters": params, "global": global_params})
            try:
                merged = runner(mergekit_yaml(method, dirs[0], dirs[1:], params, global_params), root,
                                options.random_seed)
            except SkillgraftError as e:
                s.info["error"] = str(e)
                scored.append(s)
                continue
            s.dev = bench.score(bench.on_body(merged), "dev")
            path = root / f"state-{len(scored)}.safetensors"
            save_file({k: v.contiguous() for k, v in merged.items()}, str(path))
            del merged
            kept[(method, label)] = path
            scored.append(s)
            for key in [k for k in kept if k[0] == method]:  # keep only what may still be scored on test
                if key[1] != "defaults" and key != _best(scored, method, ft):
                    kept.pop(key).unlink()
        return scored

    def _on_test(self, bench, options, ft, scored, kept) -> list[Scored]:
        """Per method its defaults and its dev-best configuration scored on test."""
        from safetensors.torch import load_file  # noqa: PLC0415

        for method in options.mergekit:
            best = _best(scored, method, ft)
            for s in scored:
                if s.method == f"mergekit {method}" and (s.config == "defaults" or (method, s.config) == best) \
                        and (method, s.config) in kept:
                    path = kept[(method, s.config)]
                    s.test = bench.score(bench.on_body(load_file(str(path))), "test")
                    s.reuse = lambda path=path: bench.on_body(load_file(str(path)))  # kept until the run ends
                    s.info["chosen_on_dev"] = (method, s.config) == best
                    s.info["writable"] = s.info["chosen_on_dev"]  # one merged body: a candidate for the written model
        return scored


def _best(scored: list[Scored], method: str, ft: Scored) -> tuple[str, str] | None:
    """The dev-best configuration of ``method``. TIES and DARE choose from the density grid they were given
    (mergekit's default density is 1: no trimming at all; that row stays as the documented reference), so the
    saved ``mergekit/ties.yaml`` carries a density of the grid; task arithmetic's defaults are its λ = 1 point."""
    mine = [s for s in scored if s.method == f"mergekit {method}" and s.dev]
    grid = [s for s in mine if s.config != "defaults"]
    if method in ("ties", "dare_ties") and grid:
        mine = grid
    if not mine:
        return None
    best = max(mine, key=lambda s: s.mean_normalized(ft, "dev"))
    return method, best.config
