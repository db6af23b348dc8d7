"""``skillgraft evaluate``: a saved model's accuracy / F1 and ECE (generative data: completion loss, exact match),
with the metrics file and plots written atomically when asked."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from skillgraft.data.spec import UserDataSpec
from skillgraft.errors import SkillgraftError
from skillgraft.verbs.result import VerbResult


@dataclass
class EvaluateResult(VerbResult):
    """The metrics of one model on one split (a user's rows: the split their file or dataset names, else ``rows``)."""

    task: str
    split: str
    metrics: dict
    labels_note: str = ""
    out: Path | None = None  # the folder the metrics and plots were written to (None: printed only)

    @property
    def generative(self) -> bool:
        return "loss" in self.metrics

    def line(self) -> str:
        """The one line ``skillgraft evaluate`` prints."""
        m = self.metrics
        if self.generative:
            em = f" exact match {m['exact_match']:.4f}" if "exact_match" in m else ""
            return (f"{self.task} {self.split} (n={m['n']}): completion loss {m['loss']:.4f} token "
                    f"accuracy {m['token_accuracy']:.4f}{em}")
        return (f"{self.task} {self.split} (n={m['n']}): acc {m['accuracy']:.4f} ECE {m['ece']:.4f}"
                + (f" F1 {m['f1']:.4f}" if "f1" in m else ""))


def evaluated_split(user: UserDataSpec) -> str:
    """The split a user's rows are, as the report names it: a dataset's split, the evaluated file's split word
    (``sst2/test.jsonl`` → ``test``, ``dev.csv`` → ``dev``), else ``rows`` (every row of the file)."""
    from skillgraft.data.user import GENERIC_NAMES  # noqa: PLC0415

    if user.eval_split or (user.eval_data is None and user.data_split):
        return user.eval_split or user.data_split
    stem = Path(str(user.eval_data or user.data)).stem.lower()
    splits = {"train", "training", "test", "testing", "dev", "validation", "valid", "val", "eval", "evaluation"}
    for word in (stem, *stem.replace("-", "_").replace(".", "_").split("_")):
        if word in splits and word in GENERIC_NAMES:
            return {"training": "train", "testing": "test", "valid": "validation", "val": "validation",
                    "evaluation": "eval"}.get(word, word)
    return "rows"


def evaluate(model_dir: str | os.PathLike, *, user: UserDataSpec | None = None, task: str | None = None,
             split: str = "test", mode: str | None = None, data_dir: str | os.PathLike | None = None,
             limit: int | None = None, out: str | os.PathLike | None = None, runtime=None) -> EvaluateResult:
    """Evaluate a skillgraft run (or its ``model/``) on its task's ``split``, or any Hugging Face checkpoint on
    every row of ``user``'s ``--eval-data`` (else ``--data``) or on ``task``'s split; ``out``: metrics.json
    (+ confidence.png and reliability.png for labelled data), all or none. ``runtime``: where it computes (None: the
    placement the command line activated), passed to the loaders."""
    from skillgraft.data import get_task, load_split  # noqa: PLC0415
    from skillgraft.evaluate import evaluate as run_eval, labels_of  # noqa: PLC0415
    from skillgraft.evaluate.plots import confidence_histogram, reliability_diagram  # noqa: PLC0415
    from skillgraft.finite import refuse_non_finite_model  # noqa: PLC0415
    from skillgraft.io import atomic_files, write_json  # noqa: PLC0415
    from skillgraft.models import Scorer  # noqa: PLC0415
    from skillgraft.models.placement import boundary  # noqa: PLC0415
    from skillgraft.models.scorer import SCORER_CONFIG  # noqa: PLC0415

    runtime = boundary(runtime)

    name, model_dir = str(model_dir), Path(model_dir)  # the name as given: ./x is a folder, never a Hub id
    user = user or UserDataSpec()
    user.refuse_options_without_data()  # --text-field, --labels … without --data: refused, not ignored
    note = ""
    folder = model_dir / "model" if (model_dir / "model").is_dir() else model_dir
    if (folder / SCORER_CONFIG).is_file() and user.data is not None:  # was "cannot tell how to score" (no class)
        raise SkillgraftError(f"{model_dir}: a skillgraft model (its {SCORER_CONFIG}) is scored on its task's splits "
                              "(--split, --task, --data-dir), not on --data rows: --data FILE evaluates a Hugging Face "
                              "checkpoint; leave --data out")
    if (folder / SCORER_CONFIG).is_file() and user.data is None:
        scorer = Scorer.from_pretrained(folder, task=task, runtime=runtime)
        examples = load_split(get_task(task or scorer.task.name) if task else scorer.task, split, data_dir)[:limit]
    else:
        from skillgraft.pipeline.opening import open_checkpoint  # noqa: PLC0415

        if user.data is None and task is None:
            raise SkillgraftError(f"{model_dir}: a Hugging Face checkpoint needs data: --data FILE (with its field "
                                  "names) or --task NAME")
        scorer, examples, note = open_checkpoint(name, user if user.data is not None else task, mode=mode,
                                                 split=split, data_dir=data_dir, runtime=runtime)
        examples = examples[:limit]
        split = evaluated_split(user) if user.data is not None else split
    refuse_non_finite_model(scorer, str(model_dir), "its scores would be meaningless (its fine-tuning diverged, "
                                                    "or the file is damaged)")
    metrics, probs = run_eval(scorer, examples, progress=split)
    result = EvaluateResult(scorer.task.name, split, metrics, note, Path(out) if out is not None else None)
    if out and result.generative:
        write_json(Path(out) / "metrics.json", metrics)
    elif out:
        with atomic_files(out) as tmp:  # the three files, or none of them
            write_json(tmp / "metrics.json", metrics)
            confidence_histogram({"model": probs}, tmp / "confidence.png")
            reliability_diagram({"model": (probs, labels_of(examples))}, tmp / "reliability.png")
    return result
