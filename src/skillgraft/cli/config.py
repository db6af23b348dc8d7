"""``--config FILE``: a verb's options from a YAML file (issue 37); options given on the command line win.

``skillgraft graft --config graft.yaml``: the keys are the verb's option names (``finetuned``, ``budgets``,
``steps``; dashes or underscores), lists as YAML lists or comma-separated text. ``skillgraft merge --config
merge.yaml`` also takes mergekit's shape::

    base_model: ./base                  # --pretrained
    models:
      - model: ./ft-sentiment           # --finetuned, once per model
        data: sentiment.jsonl           # skillgraft's own per-model keys: data, eval_data, dev_data, graft, name
      - model: ./ft-topic
        data: topic.jsonl
    merge_method: ties                  # --mergekit (a list compares several)
    parameters: {lambda: [0.5, 1.0], density: [0.2, 0.5]}   # --scales, --densities (the grid)
    out: runs/merged                    # any other option of `skillgraft merge` by name

The file becomes the command's ``default_map`` (click's mechanism for configuration files), so every value is
parsed and checked exactly as the same option on the command line; an unknown key is one line naming the
closest option. Relative paths are read from the current folder, as mergekit does.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Optional

import typer

PER_MODEL = {"data": "data", "eval_data": "eval_data", "dev_data": "dev_data", "graft": "grafts", "name": "names"}
IGNORED = ("dtype", "tokenizer_source", "tokenizer", "chat_template", "out_dtype")  # mergekit keys with no role here


def _key(k: str) -> str:
    return str(k).strip().replace("-", "_")


def _listed(v) -> list:
    return v if isinstance(v, list) else [v]


def _one(value, key: str) -> str:
    """A path or name given in a mergekit-shaped config: one value, not a list or a mapping (its printed form
    was taken as the path)."""
    if isinstance(value, (list, dict)) or value is None or isinstance(value, bool):
        raise typer.BadParameter(f"{key!r} must be one path or name, got {value!r}"[:300])
    return str(value)


def from_mergekit(cfg: dict) -> dict:
    """A mergekit-shaped merge config → ``skillgraft merge`` option values (other keys pass through)."""
    import warnings  # noqa: PLC0415

    cfg = {_key(k): v for k, v in cfg.items()}
    out: dict[str, Any] = {}
    if "base_model" in cfg:
        out["pretrained"] = _one(cfg.pop("base_model"), "base_model")
    models = cfg.pop("models", None)
    if models is not None:
        if not isinstance(models, list) or not all(isinstance(m, (dict, str)) for m in models):
            raise typer.BadParameter("'models' must be a list of {model: PATH, …} entries")
        densities = []
        for m in models:
            m = {"model": m} if isinstance(m, str) else {_key(k): v for k, v in m.items()}
            if "model" not in m:
                raise typer.BadParameter(f"a 'models' entry without 'model': {m}")
            out.setdefault("finetuned", []).append(_one(m.pop("model"), "models.model"))
            params = m.pop("parameters", None) or {}
            densities += [d for d in _listed(params.get("density", [])) if d not in densities]
            if any(w != 1 for w in _listed(params.get("weight", 1))):
                warnings.warn("a model's mergekit 'weight' is not used: skillgraft merge weighs every model 1",
                              stacklevel=2)
            for key, value in m.items():
                if key not in PER_MODEL:
                    raise typer.BadParameter(f"unknown key {key!r} in a 'models' entry (known: model, parameters, "
                                             f"{', '.join(PER_MODEL)})")
                out.setdefault(PER_MODEL[key], []).append(_one(value, f"models.{key}"))
        if densities and "densities" not in cfg:
            out["densities"] = densities
    if "merge_method" in cfg:
        out["mergekit"] = _listed(cfg.pop("merge_method"))
    params = cfg.pop("parameters", None) or {}
    if not isinstance(params, dict):
        raise typer.BadParameter("'parameters' must be a mapping (lambda, density)")
    for key, option in (("lambda", "scales"), ("density", "densities")):
        if key in params:
            out[option] = _listed(params.pop(key))
    if params:
        raise typer.BadParameter(f"unknown mergekit parameter(s) {sorted(params)} (known: lambda, density)")
    for key in IGNORED:
        cfg.pop(key, None)
    return {**out, **cfg}


def load(path: Path, ctx, *, mergekit: bool = False) -> dict:
    """The option values of ``path`` for ``ctx``'s command, as its ``default_map`` takes them. The file is read
    as every other (UTF-8 with or without a BOM, or UTF-16: ``untrusted.read_text``) and parsed by
    ``untrusted.load_yaml``: a key given twice, or aliases that expand beyond bounds, are refused naming the file and
    the line; a value of the wrong shape for its option (a list for a path or a number, a mapping anywhere) names the
    option."""
    import yaml  # noqa: PLC0415

    from skillgraft.errors import SkillgraftError  # noqa: PLC0415
    from skillgraft.io import path_problem  # noqa: PLC0415
    from skillgraft.untrusted import no_such  # noqa: PLC0415
    from skillgraft.untrusted import load_yaml  # noqa: PLC0415

    path = Path(path)
    if path_problem(path) is not None:
        raise typer.BadParameter(str(no_such(path, "config file")))
    try:
        cfg = load_yaml(path)
    except SkillgraftError as e:
        raise typer.BadParameter(str(e)) from None
    except yaml.YAMLError as e:
        raise typer.BadParameter(f"{path} is not readable YAML ({' '.join(str(e).split())})") from None
    if cfg is None:
        return {}
    if not isinstance(cfg, dict):
        raise typer.BadParameter(f"{path} must hold a mapping of option names to values")
    if not mergekit:
        spelled: dict[str, str] = {}
        for k in cfg:
            if _key(k) in spelled:
                raise typer.BadParameter(f"{path}: option {_key(k)!r} is given twice (as {spelled[_key(k)]!r} and "
                                         f"{str(k)!r}); give it once")
            spelled[_key(k)] = str(k)
    try:
        cfg = from_mergekit(cfg) if mergekit else {_key(k): v for k, v in cfg.items()}
    except typer.BadParameter as e:
        raise typer.BadParameter(f"{path}: {e.message}") from None  # the file named
    params = {p.name: p for p in ctx.command.params if p.name not in ("config", "json_output", "help")}
    values = {}
    for key, value in cfg.items():
        if key not in params:
            near = difflib.get_close_matches(key, list(params), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise typer.BadParameter(f"{path}: unknown option {key!r}{hint}")
        p = params[key]
        items = _listed(value) if getattr(p, "multiple", False) or isinstance(value, list) else [value]
        if any(isinstance(v, (dict, list)) for v in items):
            raise typer.BadParameter(f"{path}: option {key!r} takes {'values' if len(items) > 1 else 'a value'}, "
                                     f"not a {'mapping' if any(isinstance(v, dict) for v in items) else 'nested list'}"
                                     f" (got {value!r})"[:300])
        if any(isinstance(v, bool) for v in items) and not _takes_flag(p):
            raise typer.BadParameter(f"{path}: option {key!r} takes {'a number' if _takes_number(p) else 'a value'}, "
                                     f"not true/false (got {value!r})")
        if getattr(p, "multiple", False):
            value = [str(v) for v in value] if isinstance(value, list) else [str(value)]
        elif isinstance(value, list):
            if not _takes_text(p):
                raise typer.BadParameter(f"{path}: option {key!r} takes one value, got a list {value!r} (only "
                                         "options of comma-separated items take a list)"[:300])
            value = ",".join(str(v) for v in value)
        elif value is not None and not isinstance(value, (bool, int, float)):
            value = str(value)
        values[key] = value
    return values


def _takes_text(param) -> bool:
    """Whether an option takes free text (so a YAML list may stand for its comma-separated items): not a path,
    a number, a flag or a choice."""
    desc = getattr(param, "type_descriptor", None)  # typer's description of the annotation
    if desc is not None:
        return desc.annotation is str and not desc.is_path
    import click  # noqa: PLC0415

    return isinstance(getattr(param, "type", None), click.types.StringParamType)


def _takes_flag(param) -> bool:
    desc = getattr(param, "type_descriptor", None)
    return desc.annotation is bool if desc is not None else bool(getattr(param, "is_flag", False))


def _takes_number(param) -> bool:
    desc = getattr(param, "type_descriptor", None)
    return desc is not None and desc.annotation in (int, float)


def config_option(mergekit: bool = False, panel: str | None = None):
    """The ``--config FILE`` option of a verb (eager: read before every other option)."""

    def read(ctx: typer.Context, value: Optional[Path]):
        if value is not None:
            ctx.default_map = {**(ctx.default_map or {}), **load(value, ctx, mergekit=mergekit)}
        return value

    shape = ("a YAML file of this verb's options (keys: option names), or mergekit's shape: base_model, models "
             "(model + data per entry), merge_method, parameters (lambda, density)" if mergekit else
             "a YAML file of this verb's options (keys: option names; lists as YAML lists)")
    return typer.Option(None, "--config", is_eager=True, callback=read, rich_help_panel=panel,
                        help=f"{shape}; options on the command line win")
