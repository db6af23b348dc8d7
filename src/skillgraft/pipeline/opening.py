"""Opening a :class:`~skillgraft.pipeline.member.Member`: one fine-tuned model beside its pre-trained base, on one
k-shot draw and its test subset.

Every runner starts here. :func:`prepare` fine-tunes (or finds in the store) a model from typed specs;
:func:`from_run` opens a fine-tuning run directory a user already has; :func:`from_pair` takes any two
Hugging Face checkpoints (θ_pre, θ_ft: hub names or folders saved by plain transformers) and the user's own
data files (:class:`~skillgraft.data.UserDataSpec`) or a registered task. Registered tasks load through
:class:`~skillgraft.data.DataSpec`, so the same (task, k, seed, test limit) always means the same
examples, whichever verb or recipe asks.
"""

from __future__ import annotations

import os
import time
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from skillgraft.lazy import torch

from skillgraft.data.spec import DataSpec
from skillgraft.errors import SkillgraftError
from skillgraft.finite import refuse_non_finite_model
from skillgraft.graft.graft_file import GraftMetadata
from skillgraft.heap import release_freed_memory
from skillgraft.models.pair import check_pair, model_labels, pair_mode
from skillgraft.models.spec import MAX_LENGTH, ModelSpec
from skillgraft.pipeline.member import Member, MemberInputs
from skillgraft.pipeline.store import Store, draw_key, precision_key
from skillgraft.train import FinetuneConfig
from skillgraft.train.run import load_finetuned, run_finetune

if TYPE_CHECKING:
    from skillgraft.models.scorer import Scorer


def readable_as(model, folder: str | os.PathLike, chunk: int = 1 << 22) -> bool:
    """Whether every parameter of ``model`` is in ``folder``'s safetensors (read lazily, as the localizers do)
    with the same dtype and values; read in slices of about ``chunk`` values (no tensor-sized copy)."""
    from skillgraft.graft.localizers.machinery.source import SafetensorsFolder  # noqa: PLC0415

    try:
        source = SafetensorsFolder(folder)
    except SkillgraftError:
        return False  # e.g. only pytorch_model.bin
    for name, p in model.named_parameters():
        if source.shapes.get(name) != tuple(p.shape):
            return False
        value = p.detach()
        for start, read in row_slices(source, name, chunk):
            mine = value[start:start + len(read)] if value.dim() else value
            if read.dtype != p.dtype or not torch.equal(read, mine.cpu()):
                return False
    return True


def row_slices(source, name: str, chunk: int):
    """``(start, rows)`` of tensor ``name`` of a lazy θ_ft ``source``, about ``chunk`` values at a time along dim 0
    (a 0-d tensor whole): no tensor-sized copy."""
    from skillgraft.graft.localizers.machinery.source import row_slices as slices  # noqa: PLC0415

    return slices(source, name, chunk)


def refuse_non_finite_files(folder: str | os.PathLike, where: str, chunk: int = 1 << 22) -> None:
    """Every tensor of ``folder``'s safetensors must be finite, read in slices of about ``chunk`` values (a lean
    pair's θ_pre is checked this way before any work, without being loaded)."""
    from skillgraft.finite import refuse_non_finite  # noqa: PLC0415
    from skillgraft.graft.localizers.machinery.source import SafetensorsFolder  # noqa: PLC0415

    source = SafetensorsFolder(folder)
    for name in source.shapes:
        for start, part in row_slices(source, name, chunk):
            if part.is_floating_point():
                refuse_non_finite(part.reshape(-1), f"{where}: tensor {name!r} from row {start}",
                                  "a model with non-finite weights cannot be grafted (its fine-tuning diverged, "
                                  "or the file is damaged)")
    release_freed_memory()  # the slices' temporaries (kept in the heap by glibc otherwise)


def same_tensors(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two checkpoint folders' safetensors hold the same tensor names and shapes (headers only)."""
    from skillgraft.graft.localizers.machinery.source import SafetensorsFolder  # noqa: PLC0415

    try:
        return SafetensorsFolder(a).shapes == SafetensorsFolder(b).shapes
    except SkillgraftError:
        return False


def finetune_key(model: ModelSpec, data: DataSpec, finetune: FinetuneConfig, runtime=None) -> dict:
    """The store key of a fine-tuning run: its draw (:func:`~skillgraft.pipeline.store.draw_key`) and settings; a
    run in bf16 or bf16-mixed is another run (the device is not part of it: the same run on a CPU or a GPU). The
    precision is ``runtime``'s, the run's placement passed down from its verb or recipe (None: fp32)."""
    return {**draw_key(model, data), "finetune": finetune.to_dict(), **precision_key(runtime)}


def ft_stage(model: ModelSpec, data: DataSpec, finetune: FinetuneConfig, runtime=None) -> tuple[str, dict, str]:
    """The store address of a fine-tuning: (kind, key, label), as ``Store.get`` / ``Store.path`` take them."""
    return "ft", finetune_key(model, data, finetune, runtime), f"{data.task}-{data.k}-{data.seed}-{model.mode}"


def stored_run(store: Store, model: ModelSpec, data: DataSpec, finetune: FinetuneConfig,
               runtime=None) -> Path | None:
    """The run directory of this fine-tuning if the store holds it (None: it was never finished; nothing trains)."""
    entry = store.get(*ft_stage(model, data, finetune, runtime))
    return None if entry is None else entry / "run"


def finetuned_run(store: Store, model: ModelSpec, data: DataSpec, finetune: FinetuneConfig, *,
                  progress: bool = True, runtime=None) -> tuple[Path, float]:
    """The run directory of this fine-tuning (trained once under ``runtime``, then found in the store) and its
    seconds."""
    kind, key, label = ft_stage(model, data, finetune, runtime)
    t0 = time.perf_counter()

    def make(folder: Path) -> None:
        run_finetune(data, folder / "run", model=model, finetune=finetune, overwrite=True, progress=progress,
                     runtime=runtime)

    entry = store.fetch(kind, key, make, label=label)
    return entry / "run", time.perf_counter() - t0


def prepare(store: Store, model: ModelSpec, data: DataSpec, finetune: FinetuneConfig, *,
            progress: bool = False, runtime=None) -> Member:
    """Fine-tune (or find in the store) ``model`` on ``data``; load θ_ft, θ_pre and the data (placed by
    ``runtime``, the run's placement)."""
    ft_dir, seconds = finetuned_run(store, model, data, finetune, progress=progress, runtime=runtime)
    member = from_run(ft_dir, data_dir=data.data_dir, test_limit=data.test_limit, runtime=runtime)
    return dataclasses.replace(member, inputs=dataclasses.replace(member.inputs, ft_seconds=seconds))  # a new member


def from_run(ft_dir: str | os.PathLike, *, data_dir: str | os.PathLike | None = None,
             test_limit: int | None = None, pretrained: str | None = None, runtime=None) -> Member:
    """Open a fine-tuning run directory: θ_ft, θ_pre (same head initialisation), its k-shot data.

    ``data_dir`` / ``test_limit`` override the run's own (None: the run's data root, full test set);
    ``pretrained``, when given, must name the model the run was fine-tuned from (checked before any weights load);
    ``runtime``: the run's placement, passed down from its verb (both models are placed there as they load).
    """
    ft_dir = Path(ft_dir)
    if not ft_dir.exists():
        from skillgraft.untrusted import no_such  # noqa: PLC0415

        raise no_such(ft_dir, "fine-tuning run", "folder")
    base = None  # the base's model reference: resolved once here (or by load_finetuned), then passed down
    if pretrained is not None:
        from skillgraft.models.loading import model_reference  # noqa: PLC0415
        from skillgraft.train.run import read_run_config  # noqa: PLC0415

        recorded = read_run_config(ft_dir).model
        if pretrained != recorded:
            given = model_reference(pretrained)
            base = model_reference(recorded)
            if given.path != base.path:
                raise SkillgraftError(f"--pretrained {pretrained} is not the model the run {ft_dir} was fine-tuned "
                                      f"from ({recorded}); drop --pretrained or give that model")
    ft, pre, cfg, base = load_finetuned(ft_dir, base, runtime)
    refuse_non_finite_model(ft, str(ft_dir / "model"))
    refuse_non_finite_model(pre, f"base model {pre.base_model}")
    ft.eval()
    pre.eval()
    spec = DataSpec.build({"task": ft.task.name, "k": cfg.k, "seed": cfg.seed,
                           "data_dir": data_dir or cfg.data_dir, "test_limit": test_limit,
                           "dev_limit": cfg.dev_limit},  # the dev rows the run's best checkpoint was chosen on
                          where=f"{ft_dir}/config.json")
    data = spec.load(ft.task)
    inputs = MemberInputs(data, ft_dir, cfg, data_root=str(spec.data_dir) if spec.data_dir else None,
                          pre_files=_local_folder(base.path), pre_ref=base)
    return Member(data.task.name, inputs, ft, pre)


# ---------------------------------------------------------------------------------------------- checkpoint pairs
def is_run_dir(path: str | os.PathLike) -> bool:
    """A skillgraft fine-tuning run directory (``model/`` with a scorer config), not a plain checkpoint; also a
    damaged one whose ``config.json`` skillgraft wrote (``from_run`` then names what is missing)."""
    import json  # noqa: PLC0415

    path = Path(path)
    if (path / "model" / "scorer_config.json").is_file():
        return True
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and "skillgraft_version" in cfg


def from_pair(pretrained: str, finetuned: str, data, *, mode: str | None = None, max_length: int = MAX_LENGTH,
              data_dir: str | os.PathLike | None = None, lean: bool = False,
              share_pre: Callable[[Scorer], Scorer] | None = None, runtime=None, opened=None,
              pre_tensors=None) -> Member:
    """A Member from two Hugging Face checkpoints and the data to localize and evaluate on.

    ``pretrained`` (A) and ``finetuned`` (B) are hub names or folders saved by plain transformers (B may
    also be a skillgraft run directory, then opened by :func:`from_run`). ``data`` is a
    :class:`~skillgraft.data.UserDataSpec` (files) or a :class:`~skillgraft.data.DataSpec` (a registered
    task). ``mode`` defaults from B's saved class (…ForSequenceClassification → ``classifier``, …ForCausalLM →
    ``generative`` with prompt→completion data, else ``causal``; …ForMaskedLM → ``prompt``). Refused before
    any weights load: a missing folder, different architectures, shapes or vocabularies; then A lacking a
    tensor of B's body (a classification head and a pooler only B has are carried).

    ``lean`` (causal and generative pairs): θ_pre is not loaded yet (``Workbench.load_pre``), so that FT can be
    scored and released (:meth:`Workbench.release_to_files`) before θ_pre loads; its checks run when it loads.

    ``share_pre`` (a :class:`~skillgraft.pipeline.workbench.Workbench`'s ``share``): θ_pre goes through it (its
    parameters become the bench's θ_pre): loaded first, then θ_ft; or, lean, when it loads (after θ_ft's release).
    ``pre_tensors`` (a classifier pair; :meth:`Workbench.pre_tensors`): θ_pre's weights already in memory, which its
    classifier is built on (its new head drawn as loading draws it) instead of reading A's files again.

    ``runtime``: the run's placement, passed down from its verb: every model of the pair is placed there as it loads;
    ``opened``: the two models when the verb opened them and checked the pair already (``merge``), else opened
    (:func:`~skillgraft.models.loading.open_model`: each model's one entry into loading) and checked here once.
    """
    from skillgraft.data.sampling import FewShotData  # noqa: PLC0415
    from skillgraft.data.spec import UserDataSpec  # noqa: PLC0415
    from skillgraft.models.anatomy import check_compatible  # noqa: PLC0415
    from skillgraft.models.loading import Weights, open_model  # noqa: PLC0415
    from skillgraft.models.scorer import build_scorer  # noqa: PLC0415

    if is_run_dir(finetuned):
        if isinstance(data, UserDataSpec) and data.data is not None:
            raise SkillgraftError(f"{finetuned} is a skillgraft run directory: it grafts on its own task data "
                                  "(drop --data)")
        return from_run(finetuned, data_dir=data_dir, test_limit=getattr(data, "test_limit", None), runtime=runtime)
    given, models = opened, []  # each model opened once (here, or by the verb), then passed down (OpenedModel)
    for i, (name, role) in enumerate(((pretrained, "--pretrained"), (finetuned, "--finetuned"))):
        if name is None:
            raise SkillgraftError(f"{role} is required for a checkpoint pair")
        try:
            models.append(given[i] if given else open_model(name))  # a path that does not exist is refused here
        except SkillgraftError as e:
            raise SkillgraftError(f"{role}: {e}") from None
    pre_model, ft_model = models
    pre_ref, ft_ref = pre_model.ref, ft_model.ref
    user = isinstance(data, UserDataSpec) and data.data is not None
    mode = pair_mode(finetuned, user and data.generative, mode, ref=ft_ref)
    if mode == "head":
        raise SkillgraftError("--mode head adds a new random head: a checkpoint pair has no head to carry; use "
                              "classifier (the fine-tuned model's own head), prompt, causal or generative")
    if given is None:  # before any weights load (else by the verb that opened the models: merge's check_inputs)
        check_pair(pretrained, finetuned, opened=models)  # the tokenizers compared are the ones the models load with
    if user:
        if data.generative != (mode == "generative"):
            raise SkillgraftError(f"--mode {mode} needs {'prompt→completion' if mode == 'generative' else 'labelled'} "
                                  "data (--prompt-field/--completion-field for generative data)")
        labels = model_labels(finetuned, ref=ft_ref) if mode == "classifier" else None
        loaded = data.load(labels)
        task, train, dev, test = loaded.task, loaded.train, loaded.dev, loaded.test
        files, note, k, seed = loaded.files, loaded.labels_note, data.k or 0, data.seed
        data_note = loaded.source_note
    else:
        if mode == "generative":
            raise SkillgraftError("generative mode needs prompt→completion data: --data FILE with --prompt-field and "
                                  "--completion-field")
        few = data.load()
        task, train, dev, test, files, note, k, seed = few.task, few.train, few.dev, few.test, None, "", few.k, few.seed
        data_note = ""
    if mode == "classifier":
        n = len(model_labels(finetuned, ref=ft_ref))
        if n != task.num_labels:
            raise SkillgraftError(f"the fine-tuned classifier {finetuned} has {n} outputs but the data has "
                                  f"{task.num_labels} labels {list(task.labels)}")
    deferred = None  # a lean pair's θ_pre, loaded once θ_ft is released
    if mode in ("causal", "generative"):
        from skillgraft.models.scorer import Scorer  # noqa: PLC0415

        def causal(model, role: str) -> Scorer:  # its weights: the rest of the model's opening
            loaded = model.weights(Weights("causal", runtime=runtime, role=role))
            return Scorer(loaded.model, loaded.tokenizer, task, mode, pooling="last", max_length=max_length,
                          base_model=loaded.ref.name, runtime=runtime)

        def load_pre() -> Scorer:  # deferred: A's files were checked for non-finite values before any work
            from skillgraft.graft.identity import fingerprint_from_files  # noqa: PLC0415

            pre = causal(pre_model, "pre-trained")
            # what the store keys and grafts need of θ_pre's identity, read from A's files: a memory-mapped model's
            # pages stay untouched until the work reads them (most of the embedding matrix never is)
            fingerprint_from_files(pre, pre_ref.path)
            return pre.eval()

        # lean only when A's and B's safetensors list the same tensors (else both load now: A refused before work)
        lean = lean and same_tensors(pre_ref.path, ft_ref.path)
        if lean:  # θ_pre loads later: its weights are still checked before any work, slice by slice
            refuse_non_finite_files(pre_ref.path, f"--pretrained {pretrained}")
        if share_pre is not None and not lean:  # θ_pre first, shared: the old one is freed before θ_ft loads
            pre = share_pre(causal(pre_model, "pre-trained"))
            ft = causal(ft_model, "fine-tuned")
        else:
            ft = causal(ft_model, "fine-tuned")
            pre = None if lean else causal(pre_model, "pre-trained")
        deferred = (load_pre if share_pre is None else lambda: share_pre(load_pre())) if lean else None
    else:
        if share_pre is not None:  # θ_pre first, shared: the old one is freed before θ_ft loads
            pre = share_pre(build_scorer(pre_model, task, mode, max_length=max_length, runtime=runtime,
                                         tensors=pre_tensors if mode == "classifier" else None))
            ft = build_scorer(ft_model, task, mode, max_length=max_length, runtime=runtime)
        else:
            ft = build_scorer(ft_model, task, mode, max_length=max_length, runtime=runtime)
            pre = build_scorer(pre_model, task, mode, max_length=max_length, runtime=runtime)
        if mode == "classifier" and ft.carried - pre.carried:
            raise SkillgraftError(f"the fine-tuned checkpoint {finetuned} lacks tensors of its own classifier: "
                                  f"{sorted(ft.carried - pre.carried)[:3]}")
        ft.carried = pre.carried  # what θ_pre lacks travels whole
    if pre is not None:
        check_compatible(pre, ft)
    refuse_non_finite_model(ft, f"--finetuned {finetuned}")
    ft.eval()
    if pre is not None:  # a deferred θ_pre is checked when it loads (Workbench.load_pre)
        refuse_non_finite_model(pre, f"--pretrained {pretrained}")
        pre.eval()
    few = FewShotData(task, k, seed, train, dev, test)
    pre_name = pre_ref.name  # θ_pre may not be loaded yet (a lean pair)
    root = getattr(data, "data_dir", None) if not user else None
    meta = {"pretrained": pre_name, "finetuned": ft.base_model, "task_spec": task_record(task)}
    if user:
        meta["user_data"] = data.to_dict()
    inputs = MemberInputs(few, Path(finetuned), None, data_root=str(root) if root else None, data_files=files,
                          labels_note=note, data_note=data_note,
                          graft_metadata=GraftMetadata.build(meta, where="graft metadata"),
                          pre_files=_local_folder(pre_ref.path), pre_ref=pre_ref, ft_ref=ft_ref)
    return Member(task.name, inputs, ft, pre, load_pre=deferred,
                  ft_files=Path(ft_ref.path) if deferred else None)


def _local_folder(path: str) -> Path | None:
    """``path`` when it is a local folder with safetensors weights (else None: a hub id, or .bin weights)."""
    folder = Path(path)
    has = folder.is_dir() and ((folder / "model.safetensors").is_file()
                               or (folder / "model.safetensors.index.json").is_file())
    return folder if has else None


def task_record(task) -> dict:
    """A task as JSON (graft metadata), read back by :func:`task_from_record`."""
    from dataclasses import asdict  # noqa: PLC0415

    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(task).items() if k != "description"}


def task_from_record(record: dict):
    """The task a graft's metadata records (a registered-style task, or a generative one)."""
    from skillgraft.models.scorer import task_from_config  # noqa: PLC0415

    return task_from_config(dict(record), "graft metadata task_spec")


def open_checkpoint(path: str, data, *, mode: str | None = None, split: str = "test", max_length: int = MAX_LENGTH,
                    data_dir: str | os.PathLike | None = None, runtime=None):
    """A plain Hugging Face checkpoint as a Scorer with the examples to evaluate it on: ``(scorer, examples, note)``.

    ``data`` is a :class:`~skillgraft.data.UserDataSpec` (every row of ``--eval-data``, else of ``--data``)
    or a registered task name (its ``split``). ``mode`` defaults from the checkpoint's class, as for a pair.
    """
    from skillgraft.data.loading import load_split  # noqa: PLC0415
    from skillgraft.data.spec import UserDataSpec  # noqa: PLC0415
    from skillgraft.data.tasks import get_task  # noqa: PLC0415
    from skillgraft.models.scorer import build_scorer  # noqa: PLC0415

    user = isinstance(data, UserDataSpec)
    mode = pair_mode(path, user and data.generative, mode)
    if user:
        if data.generative != (mode == "generative"):
            wanted = "prompt→completion" if mode == "generative" else "labelled"
            raise SkillgraftError(f"--mode {mode} needs {wanted} data")
        labels = model_labels(path) if mode == "classifier" else None
        loaded = data.replace(eval_data=data.eval_data or data.data).load(labels)
        task, examples, note = loaded.task, loaded.test, loaded.labels_note
        if task.num_labels:  # rows of one label: accuracy means little (a warning line; docs/reliability.md §11)
            from skillgraft.pipeline.caveats import one_label, warned  # noqa: PLC0415

            warned([one_label([e.label for e in examples], tuple(task.labels), str(data.eval_data or data.data))])
    else:
        task, note = get_task(data), ""
        examples = load_split(task, split, data_dir)
    if mode == "classifier" and len(model_labels(path)) != task.num_labels:
        raise SkillgraftError(f"the classifier {path} has {len(model_labels(path))} outputs but the data has "
                              f"{task.num_labels} labels {list(task.labels)}")
    scorer = build_scorer(path, task, mode, max_length=max_length, runtime=runtime).eval()
    return scorer, examples, note
