"""The inputs of ``skillgraft merge``: one fine-tuned model per ``--finetuned`` with its data (or its graft), read
from the command line's lists and refused, before any weights load, when they cannot be merged."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from skillgraft.data.spec import UserDataSpec
from skillgraft.errors import SkillgraftError


@dataclass
class ModelInput:
    """One fine-tuned model to merge, with the data it is localized and scored on."""

    finetuned: str
    data: UserDataSpec | None = None
    dev_data: Path | None = None
    graft: Path | None = None
    name: str = ""


def resolve_inputs(*, pretrained: str | None, finetuned: list[str], data: list[str], eval_data: list[str],
                   dev_data: list[str], grafts: list[str], shared: UserDataSpec,
                   names: list[str] | None = None) -> tuple[str, list[ModelInput]]:
    """The models to merge from the CLI lists (one per model, in the same order); one line on any mismatch.

    A ``--data`` entry ending in ``.yaml``/``.yml`` is a data spec (``UserDataSpec`` fields: data, eval_data,
    text_field, text_pair_field, labels, …; paths relative to the file) over the shared options.
    """
    from skillgraft.spec import read_yaml  # noqa: PLC0415

    records = [_graft_record(g) for g in grafts]
    if grafts and finetuned and len(finetuned) != len(grafts):
        raise SkillgraftError(f"{len(grafts)} --grafts but {len(finetuned)} --finetuned models: give one per graft, "
                              "in the same order, or none (each graft's recorded fine-tuned model)")
    if grafts and not finetuned:
        finetuned = [r.get("finetuned") or _missing(g, "finetuned") for g, r in zip(grafts, records)]
        pretrained = pretrained or records[0].get("pretrained") or _missing(grafts[0], "pretrained")
    n = len(finetuned)
    if n < 2:
        raise SkillgraftError(f"merging needs at least two fine-tuned models (--finetuned, once per model); got {n}")
    if pretrained is None:
        raise SkillgraftError("--pretrained is required: the checkpoint every --finetuned model was fine-tuned from")
    if not data and grafts and all(r.get("user_data") for r in records):
        specs = [UserDataSpec.build(r["user_data"], where=f"{g} metadata user_data") for g, r in zip(grafts, records)]
    else:
        if len(data) != n:
            raise SkillgraftError(f"{n} fine-tuned models but {len(data)} --data: give one --data per model, in the "
                                  "same order (a model without data cannot be localized or scored)")
        specs = []
        for d in data:
            if str(d).endswith((".yaml", ".yml")):
                values = read_yaml(d)
                root = Path(d).parent
                for key in ("data", "eval_data"):
                    if values.get(key) and not Path(values[key]).is_absolute() and (root / values[key]).exists():
                        values[key] = str(root / values[key])
                specs.append(UserDataSpec.build({**shared.model_dump(exclude={"data", "eval_data"}), **values},
                                                where=str(d)))
            else:
                specs.append(shared.replace(data=d))
    for option, values in (("--eval-data", eval_data), ("--dev-data", dev_data)):
        if values and len(values) != n:
            raise SkillgraftError(f"{n} fine-tuned models but {len(values)} {option}: give one per model or none")
    if eval_data:
        specs = [s.replace(eval_data=e) for s, e in zip(specs, eval_data)]
    for i, s in enumerate(specs):
        if s.data is None:
            raise SkillgraftError(f"model {i + 1} ({finetuned[i]}): no --data")
        for p in (s.data, s.eval_data, dev_data[i] if dev_data else None):
            if p is not None and Path(p).suffix.lower() in (".jsonl", ".json", ".csv", ".tsv") and not Path(p).exists():
                raise SkillgraftError(f"model {i + 1} ({finetuned[i]}): data file not found: {p}")
    names = _given_names(names, n) if names else task_names(finetuned, [s.data for s in specs],
                                                               [s.data_config for s in specs])
    return pretrained, [ModelInput(str(f), s, Path(dev_data[i]) if dev_data else None,
                                   Path(grafts[i]) if grafts else None, names[i])
                        for i, (f, s) in enumerate(zip(finetuned, specs))]


def _graft_record(path: str) -> dict:
    from skillgraft.graft.graft_file import CONFIG_FILE  # noqa: PLC0415
    from skillgraft.untrusted import read_json  # noqa: PLC0415

    cfg = Path(path) / CONFIG_FILE
    if not cfg.is_file():
        raise SkillgraftError(f"--grafts {path}: not a graft folder (no {CONFIG_FILE})")
    meta = read_json(cfg, what="graft config").get("metadata") or {}
    return {**meta, "base_fingerprint": read_json(cfg, what="graft config").get("base_fingerprint")}


def _missing(graft: str, what: str):
    raise SkillgraftError(f"--grafts {graft} records no {what} model; pass --{what}")


def _given_names(names: list[str], n: int) -> list[str]:
    """``--names``: one per model, distinct, usable as a folder name (grafts/<name>, routed/skills/<name>)."""
    if len(names) != n:
        raise SkillgraftError(f"{n} fine-tuned models but {len(names)} --names: give one name per model, in the "
                              "--finetuned order, or none (each model's folder name)")
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", name):
            raise SkillgraftError(f"--names {name!r}: a name is letters, digits, '.', '_', '+' or '-' (it names a "
                                  "folder), starting with a letter or digit")
    twice = sorted({x for x in names if names.count(x) > 1})
    if twice:
        raise SkillgraftError(f"--names {twice[0]!r} is given twice: each model needs its own name")
    return list(names)


def task_names(finetuned: list[str], data: list | None = None, configs: list | None = None) -> list[str]:
    """One name per model: its folder name — when that is generic (``sst2/ft``, ``runs/subj/checkpoint-500``), its
    data's name (``sst2/train.jsonl`` → ``sst2``), else the folder above (:func:`~skillgraft.data.user.passed_name`)
    —, made unique (``-2``, ``-3``) where two share one. The name is the folder's own once ``..`` and ``.`` are folded (``x/..`` names the folder it leads
    to: its name was ``..``, and ``grafts/..`` put a model's graft beside the output's temporary folder, failing
    after all the work), kept to the characters ``--names`` allows (letters, digits, ``.``, ``_``, ``+``, ``-``; a
    leading dot dropped)."""
    data = data or [None] * len(finetuned)
    configs = configs or [None] * len(finetuned)
    base = [_folder_name(f, d, c) for f, d, c in zip(finetuned, data, configs)]
    out, seen = [], {}
    for b in base:
        seen[b] = seen.get(b, 0) + 1
        out.append(b if base.count(b) == 1 else f"{b}-{seen[b]}")
    return out


def _folder_name(path, data=None, config=None) -> str:
    import os  # noqa: PLC0415

    from skillgraft.data.user import generic_name, passed_name  # noqa: PLC0415

    text = str(path)
    name = Path(os.path.abspath(text)).name if os.path.exists(text) or text.startswith((".", "/")) else Path(text).name
    if generic_name(name):  # sst2/ft, runs/subj/checkpoint-500: the data's name, else the folder above
        named = passed_name(data, config) if data is not None else ""
        name = named if named and not generic_name(named) else passed_name(text)
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".")
    return name or "model"


def weight_files(path: str, ref=None) -> list[Path]:
    """The weight files of a checkpoint folder (safetensors, else pickled .bin), for sizes and identity (``ref``: its
    model reference, when the run resolved it already)."""
    if ref is None:
        from skillgraft.models.loading import model_reference  # noqa: PLC0415

        ref = model_reference(path)
    folder = Path(ref.path)
    if not folder.is_dir():
        return []
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    return files or sorted((folder / "model").glob("*.safetensors"))


def check_inputs(pretrained: str, inputs: list[ModelInput], spec) -> tuple[str, dict]:
    """Refuse, before any weights load, what cannot be merged; returns the scoring mode they share and each model
    opened by its name (:func:`~skillgraft.models.loading.open_model`: resolved and its tokenizer loaded once here,
    then passed down: ``from_pair(opened=…)``)."""
    from skillgraft.models.loading import open_model  # noqa: PLC0415
    from skillgraft.models.pair import check_pair, pair_mode  # noqa: PLC0415
    from skillgraft.pipeline.opening import is_run_dir  # noqa: PLC0415
    from skillgraft.digest import file_digest  # noqa: PLC0415

    try:
        opened = {pretrained: open_model(pretrained)}
    except SkillgraftError as e:
        raise SkillgraftError(f"--pretrained: {e}") from None
    seen: dict[str, str] = {}
    base_files = weight_files(pretrained, opened[pretrained].ref)
    if base_files:
        seen[file_digest(base_files)] = f"the --pretrained model {pretrained}"
    modes = {}
    for m in inputs:
        try:
            model = opened[m.finetuned] = opened.get(m.finetuned) or open_model(m.finetuned)
        except SkillgraftError as e:
            raise SkillgraftError(f"--finetuned: {e}") from None
        if is_run_dir(m.finetuned):
            raise SkillgraftError(f"--finetuned {m.finetuned} is a skillgraft run directory; merge takes Hugging Face "
                                  "checkpoints (export the run's model/ folder, or pass it directly)")
        ref = model.ref
        files = weight_files(m.finetuned, ref)
        key = file_digest(files) if files else os.path.realpath(ref.path)
        if key in seen:
            raise SkillgraftError(f"--finetuned {m.finetuned} is the same model as {seen[key]} (identical weights): "
                                  "give each fine-tuned model once")
        seen[key] = f"--finetuned {m.finetuned}"
        check_pair(pretrained, m.finetuned, opened=(opened[pretrained], model))  # architecture, shapes, vocabulary
        modes[m.finetuned] = pair_mode(m.finetuned, m.data.generative, spec.mode, ref=ref)
    if len(set(modes.values())) > 1:
        shown = ", ".join(f"{k} → {v}" for k, v in modes.items())
        raise SkillgraftError(f"the models are scored differently ({shown}); merge models of one kind, or set --mode")
    prints = {_graft_record(str(m.graft)).get("base_fingerprint") for m in inputs if m.graft is not None}
    if len(prints - {None}) > 1:
        raise SkillgraftError(f"the --grafts were learned on different base models "
                              f"(fingerprints {sorted(prints - {None})})")
    return next(iter(modes.values())), opened


def merge_inputs(pretrained: str, inputs: list[ModelInput], store=None) -> dict:
    """The paths a merge reads or fills (none may lie inside its --out)."""
    from skillgraft.pipeline.store import Store  # noqa: PLC0415

    paths = {"--cache": (store or Store()).root, "--pretrained": pretrained}
    for i, m in enumerate(inputs, 1):
        data = m.data or UserDataSpec()
        paths |= {f"--finetuned {i}": m.finetuned, f"--data {i}": data.data, f"--eval-data {i}": data.eval_data,
                  f"--dev-data {i}": m.dev_data, f"--grafts {i}": m.graft}
    return paths
