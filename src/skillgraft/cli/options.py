"""CLI options generated from typed specs: each field's name, type, default and help are written once.

    @app.command()
    @from_specs(localize=Options(LocalizeConfig, rename={"seed": "s-seed"}))
    def graft(finetuned: Path = typer.Option(...), *, localize: LocalizeConfig): ...

``from_specs`` replaces the function's signature with its own parameters plus one ``--option`` per spec
field (``snake_case`` → ``--snake-case``; lists are given comma-separated), and calls the function with
validated spec objects. A bad value is one line naming the option (``--lr: must be > 0 (got -1)``).
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import typer
from pydantic import ValidationError

from skillgraft.errors import SkillgraftError
from skillgraft.spec import Spec


@dataclass
class Options:
    """Which fields of ``spec`` become options, under which names."""

    spec: type[Spec]
    rename: dict[str, str] = field(default_factory=dict)   # field → option name (no dashes, snake_case)
    skip: tuple[str, ...] = ()                             # fields not offered on the command line
    fixed: dict[str, Any] = field(default_factory=dict)    # fields set by the verb, not by the user
    help: dict[str, str] = field(default_factory=dict)     # extra help for a field in this verb only
    panel: str | None = None                               # the --help panel of these options (default: Options)
    shown: dict[str, str] = field(default_factory=dict)    # field → the default --help shows (default: the spec's)
    old: dict[str, str] = field(default_factory=dict)      # field → a former option name, kept as an alias that warns

    def fields(self) -> dict[str, Any]:
        """The spec's fields offered as options (not skipped, not fixed by the verb)."""
        return {n: f for n, f in self.spec.model_fields.items() if n not in self.skip and n not in self.fixed}

    def option(self, name: str) -> str:
        """The option name (snake_case, no dashes) of field ``name``."""
        return self.rename.get(name, name)


def _unwrap_optional(tp):
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _cli_type(tp):
    """(annotation typer understands, is_list)."""
    inner, optional = _unwrap_optional(tp)
    origin = typing.get_origin(inner)
    if origin in (list, tuple):
        return Optional[str], True
    if origin is Literal:
        return (Optional[inner] if optional else inner), False
    if inner in (bool, int, float, str, Path):
        return (Optional[inner] if optional else inner), False
    return Optional[str], False  # anything else (e.g. a Budget) is parsed by the spec from its text


def _shown_default(info, is_list: bool) -> str | bool:
    """The spec's default as --help shows it (False: nothing to show): numbers as written (``1e+07``), lists
    comma-separated (``""``: empty), switches on / off."""
    from skillgraft.cli.help import number  # noqa: PLC0415

    default = info.get_default(call_default_factory=True)
    if default is None:
        return False
    if is_list:
        return ",".join(number(x) for x in default) or '""'
    if hasattr(default, "key") and not isinstance(default, (str, int, float)):
        default = default.key
    return number(default)


def _parse_list(text: str | None):
    if text is None:
        return None
    return [x.strip() for x in str(text).split(",") if x.strip()]  # "" → an empty list


def from_specs(**sections: Options):
    """Generate ``--options`` from the specs' fields; call the function with built spec objects."""

    def decorate(fn):
        sig = inspect.signature(fn)
        own = [p for name, p in sig.parameters.items() if name not in sections]
        taken = {p.name for p in own}
        generated: list[inspect.Parameter] = []
        lists: dict[str, tuple[str, str]] = {}
        aliases: dict[str, str] = {}                    # former option name → its new name
        owner: dict[str, tuple[str, str]] = {}          # parameter name → (section, field)
        for section, opts in sections.items():
            for name, info in opts.fields().items():
                opt = opts.option(name)
                if opt in taken:
                    raise RuntimeError(f"{fn.__name__}: option --{opt} declared twice; rename one")
                taken.add(opt)
                annotation, is_list = _cli_type(info.annotation)
                if is_list:
                    lists[opt] = (section, name)
                help_text = opts.help.get(name) or info.description or ""
                flag = f"--{opt.replace('_', '-')}"
                if annotation is bool:  # a switch: --name / --no-name
                    flag = f"{flag}/--no-{opt.replace('_', '-')}"
                shown = opts.shown.get(name) or _shown_default(info, is_list)
                # Every option defaults to None (= not given): only what the user sets reaches the spec, so
                # ``spec.model_fields_set`` is exactly the user's choices and the spec supplies the rest (a
                # localizer then resolves its own defaults, issue 22). --help shows the spec's default.
                param = inspect.Parameter(opt, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[annotation],
                                          default=typer.Option(None, flag, help=help_text, show_default=shown,
                                                               metavar="LIST" if is_list else None,
                                                               rich_help_panel=opts.panel))
                generated.append(param)
                owner[opt] = (section, name)
                if name in opts.old:  # a renamed option: the old name still works, hidden from --help, and warns
                    former = opts.old[name]
                    if former in taken:
                        raise RuntimeError(f"{fn.__name__}: option --{former} declared twice")
                    taken.add(former)
                    generated.append(inspect.Parameter(
                        former, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[annotation],
                        default=typer.Option(None, f"--{former.replace('_', '-')}", hidden=True)))
                    aliases[former] = opt
                    if is_list:
                        lists[former] = (section, name)
        kinds = [p for p in own if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own if p not in kinds]

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            values: dict[str, dict[str, Any]] = {s: dict(o.fixed) for s, o in sections.items()}
            for former, new in aliases.items():
                v = kwargs.pop(former, None)
                if v is None:
                    continue
                old_flag, new_flag = f"--{former.replace('_', '-')}", f"--{new.replace('_', '-')}"
                if kwargs.get(new) is not None:
                    raise SkillgraftError(f"{old_flag} is the former name of {new_flag}: give one of them")
                import warnings  # noqa: PLC0415

                warnings.warn(f"{old_flag} is renamed {new_flag} (the old name still works, for now)", stacklevel=2)
                kwargs[new] = v
            for opt, (section, name) in owner.items():
                if opt not in kwargs:
                    continue
                v = kwargs.pop(opt)
                if opt in lists:
                    v = _parse_list(v)
                values[section][name] = v
            built = {s: build(sections[s], values[s]) for s in sections}
            return fn(*args, **kwargs, **built)

        wrapper.__signature__ = sig.replace(parameters=[*kinds, *rest, *generated])
        wrapper.__annotations__ = {p.name: p.annotation for p in wrapper.__signature__.parameters.values()}
        return wrapper

    return decorate


def build(opts: Options, values: dict[str, Any]) -> Spec:
    """The spec from CLI values; a validation error names the option (``--name: problem (got value)``)."""
    values = {k: v for k, v in values.items() if v is not None or k in opts.fixed}
    try:
        return opts.spec.model_validate(values)
    except ValidationError as e:
        parts = []
        for item in e.errors():
            name = str(item["loc"][0]) if item["loc"] else ""
            opt = "--" + opts.option(name).replace("_", "-") if name else opts.spec.__name__
            msg = item["msg"].removeprefix("Value error, ")
            got = item.get("input")
            parts.append(f"{opt}: {msg}" + ("" if isinstance(got, dict) else f" (got {got!r})"))
        raise SkillgraftError("; ".join(parts)) from None


def default_of(fn, name: str):
    """The default of ``fn``'s parameter ``name``: an option whose verb holds the default reads it from there
    (written once, in the verb's signature)."""
    import inspect  # noqa: PLC0415

    return inspect.signature(fn).parameters[name].default


def nonempty_path(text: str) -> Path:
    """A path option's value: an empty one (``--out "$OUT"`` with OUT unset) is refused by name, not read as the
    current folder (typer would turn ``''`` into ``Path('.')``, the same value as a deliberate ``--out .``)."""
    if not str(text).strip():
        raise typer.BadParameter("an empty path (an unset shell variable?); give a path, or . for this folder")
    return Path(text)


def guard_empty_paths(app: typer.Typer) -> None:
    """Give every path-typed option and argument of ``app``'s commands (and its sub-apps') :func:`nonempty_path` as
    its parser, once the commands are registered."""
    infos = (typer.models.OptionInfo, typer.models.ArgumentInfo)
    for command in app.registered_commands:
        try:
            hints = typing.get_type_hints(command.callback)
        except Exception:  # noqa: BLE001 - an annotation that cannot be resolved: leave that command as it is
            continue
        for name, p in inspect.signature(command.callback).parameters.items():
            inner, _ = _unwrap_optional(hints.get(name))
            if inner is Path and isinstance(p.default, infos) and p.default.parser is None:
                p.default.parser = nonempty_path
                p.default.metavar = p.default.metavar or ("PATH" if isinstance(p.default, typer.models.OptionInfo)
                                                          else name.upper())
    for group in app.registered_groups:
        guard_empty_paths(group.typer_instance)
