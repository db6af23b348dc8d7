"""``--help`` that reads at 80 columns: options grouped into panels, each option name whole, one style for types,
ranges and defaults (issue 37).

Typer's own layout puts names, negative names, types and help in five table columns; at 80 columns rich squeezes
them until names are cut (``--gradient-che…``). Here each option is one name cell (``--[no-]overwrite``,
``--lr FLOAT``) and a help cell wrapped beside it, or under it when the name is longer than the name column:
a name is never cut. The panel is the option's ``rich_help_panel`` (``options.Options(panel=…)`` for generated
options). Nothing here imports more than typer and rich: ``--help`` stays fast.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import typer
from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from typer.core import TyperArgument, TyperCommand, TyperGroup

HUGE = 2**31 - 1          # an upper bound this large is no bound a user needs to read (COUNT_MAX, SEED_MAX)
NAME_WIDTH = 30           # the widest name column; a longer name has its help on the lines under it
OPTIONS = "Options"
ARGUMENTS = "Arguments"
HELP_ALL = "--help-all"


def number(v: Any) -> str:
    """A number as a user writes it: ``1e+07`` not ``10000000.0``, ``0.5`` not ``0.50000``."""
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def shown_default(value: Any) -> str | None:
    """A default as ``--help`` shows it (None: nothing to show)."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, (list, tuple)):
        return ",".join(number(x) for x in value) or None
    if hasattr(value, "value") and not isinstance(value, (int, float, str)):  # an Enum
        value = value.value
    return number(value)


def range_text(param) -> str | None:
    """``x ≥ 8``, ``0 ≤ x ≤ 1``: an option's range in words (huge upper bounds left out)."""
    lo, hi = getattr(param, "min", None), getattr(param, "max", None)
    if hi is not None and hi >= HUGE:
        hi = None
    if lo is None and hi is None:
        return None
    if lo is not None and hi is not None:
        return f"{number(lo)} ≤ x ≤ {number(hi)}"
    return f"x ≥ {number(lo)}" if lo is not None else f"x ≤ {number(hi)}"


def _choices(param) -> list[str] | None:
    desc = getattr(param, "type_descriptor", None)
    choices = getattr(desc, "choices", None) if desc is not None else None
    return None if choices is None else [str(getattr(c, "value", c)) for c in choices]


def metavar(param) -> str:
    """The value's kind after the option's name: INT, FLOAT, PATH, TEXT, LIST, {a|b} (nothing for a switch)."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    if param.metavar:
        return param.metavar
    choices = _choices(param)
    if choices is not None:
        text = "|".join(choices)
        return f"{{{text}}}" if len(text) <= 16 else "CHOICE"
    desc = param.type_descriptor
    if desc.is_path:
        return "PATH"
    ann = desc.annotation
    if desc.is_list:
        (ann,) = typing.get_args(ann) or (str,)
    return {int: "INT", float: "FLOAT", bool: "BOOL"}.get(ann, "TEXT")


def names(param) -> str:
    """The option's names whole: ``--lr FLOAT``, ``--[no-]overwrite``, ``-h, --help``; an argument's NAME."""
    if isinstance(param, TyperArgument):
        return (param.metavar or param.name or "").upper()
    opts = sorted(param.opts, key=lambda o: (o.startswith("--"), o))
    second = list(param.secondary_opts)
    if len(opts) == 1 and second == [f"--no-{opts[0][2:]}"]:
        text = f"--[no-]{opts[0][2:]}"
    else:
        text = ", ".join(opts + second)
    mv = metavar(param)
    return f"{text} {mv}" if mv else text


def tail(param, ctx) -> list[str]:
    """The bracketed facts after an option's help: choices (when not in the name), range, default, required."""
    out = []
    help_text = getattr(param, "help", None) or ""
    choices = _choices(param)
    if choices is not None and metavar(param) == "CHOICE" and not all(c in help_text for c in choices):
        out.append("one of: " + " | ".join(choices))
    rng = range_text(param)
    if rng:
        out.append(rng)
    if getattr(param, "multiple", False):
        out.append("repeatable")
    show = getattr(param, "show_default", None)
    if isinstance(show, str):
        out.append(f"default: {show}")
    elif show is not False and not param.required:
        d = param.default
        if callable(d):
            d = None
        if getattr(param, "is_flag", False) and param.secondary_opts:
            d = "on" if d else "off"
        elif getattr(param, "is_flag", False):
            d = None  # a plain flag (--help, --version): off unless given
        text = shown_default(d)
        if text is not None:
            out.append(f"default: {text}")
    if param.required:
        out.append("required")
    return [f"[{x}]" for x in out]


def _wrap(tokens: list[tuple[str, str]], width: int) -> list[Text]:
    """Greedy word wrap of (word, style) tokens into lines of at most ``width`` cells (a longer word stands alone)."""
    lines: list[Text] = []
    line, used = Text(), 0
    for word, style in tokens:
        n = len(word)
        if used and used + 1 + n > width:
            lines.append(line)
            line, used = Text(), 0
        if used:
            line.append(" ")
            used += 1
        line.append(word, style=style)
        used += n
    if used or not lines:
        lines.append(line)
    return lines


def option_rows(rows: list[tuple[str, list[tuple[str, str]]]], inner: int) -> list[Text]:
    """Lines of one panel: each name whole, its help beside it (or under it when the name is wider than the
    name column)."""
    name_w = min(max((len(n) for n, _ in rows), default=0), NAME_WIDTH, max(inner // 2, 12))
    help_w = max(inner - name_w - 2, 20)
    out: list[Text] = []
    for name, tokens in rows:
        helps = _wrap(tokens, help_w) if tokens else [Text()]
        if len(name) > name_w:
            out.append(Text(name, style="bold cyan"))
            first = []
        else:
            first = [helps.pop(0)]
            out.append(Text.assemble((name.ljust(name_w), "bold cyan"), "  ", *first))
        for h in helps:
            out.append(Text.assemble(" " * (name_w + 2), h))
    return out


def help_tokens(param, ctx) -> list[tuple[str, str]]:
    text = " ".join((getattr(param, "help", None) or "").split())
    tokens = [(w, "") for w in text.split()]
    for fact in tail(param, ctx):
        tokens += [(w, "dim") for w in fact.split()]
    return tokens


def paragraphs(text: str) -> list[str]:
    """A docstring's paragraphs, each on one logical line (single line breaks joined)."""
    text = inspect.cleandoc(text or "")
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def usage(cmd, ctx) -> str:
    parts = [ctx.command_path]
    if isinstance(cmd, TyperGroup):
        return f"{ctx.command_path} [OPTIONS] COMMAND [ARGS]..."
    if any(not isinstance(p, TyperArgument) for p in cmd.get_params(ctx)):
        parts.append("[OPTIONS]")
    for p in cmd.get_params(ctx):
        if isinstance(p, TyperArgument):
            name = names(p)
            parts.append(name if p.required else f"[{name}]")
    return " ".join(parts)


def first_sentence(tokens: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """An option's help cut to its first clause (up to ``;`` / ``:`` / ``. ``), its bracketed facts kept: the short
    ``--help``'s one line per option."""
    words = [t for t in tokens if t[1] != "dim"]
    facts = [t for t in tokens if t[1] == "dim" and not t[0].startswith(("[one", "of:"))]
    cut, depth = [], 0
    for word, style in words:
        cut.append((word, style))
        depth += word.count("(") + word.count("[") - word.count(")") - word.count("]")
        if depth <= 0 and word.endswith((";", ":", ".")) and len(cut) >= 3:
            cut[-1] = (word.rstrip(";:."), style)
            break
    return cut + facts


def _common(cmd, param) -> bool:
    return isinstance(param, TyperArgument) or any(o in cmd.common for o in param.opts) or param.name in cmd.common


def describe(cmd, ctx, full: bool = True) -> dict:
    """What ``cmd``'s help says, independent of the width: usage, paragraphs, panels of (name, help tokens) and, for
    a group, its commands. (:func:`show` lays it out at the console's width). ``full=False``: the short ``--help`` of
    a command with many options (``common``): its first paragraph, its common options with the first clause of their
    help, and a last panel naming what ``--help-all`` adds."""
    panels: dict[str, list] = {}
    hidden: dict[str, int] = {}
    short = not full and bool(getattr(cmd, "common", ()))
    for param in cmd.get_params(ctx):
        if getattr(param, "hidden", False) or param.name == HELP_ALL[2:].replace("-", "_"):
            continue
        default_panel = ARGUMENTS if isinstance(param, TyperArgument) else OPTIONS
        panel = getattr(param, "rich_help_panel", None) or default_panel
        if short and not _common(cmd, param) and "--help" not in param.opts:
            hidden[panel] = hidden.get(panel, 0) + 1
            continue
        panels.setdefault(panel, []).append(param)
    order = sorted(panels, key=lambda p: (p != ARGUMENTS, p == OPTIONS))  # arguments first, general options last
    cut = first_sentence if short else (lambda tokens: tokens)
    out = {"usage": usage(cmd, ctx)[len(ctx.command_path):].split(),  # without the command's path: the caller's
           "paragraphs": paragraphs(cmd.help or "")[:1 if short else None],
           "panels": [[title, [[names(p), cut(help_tokens(p, ctx))] for p in panels[title]]] for title in order]}
    if short:
        more = ", ".join(f"{title} {n}" for title, n in hidden.items())
        out["panels"].append(["More options", [[HELP_ALL, [(w, "") for w in (
            f"every option with its full help ({sum(hidden.values())} more: {more})").split()]]]])
    if isinstance(cmd, TyperGroup):
        rows = []
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                first = (paragraphs(sub.help or "") or [""])[0]
                rows.append([name, [[w, ""] for w in first.split()]])
        out["panels"].append(["Commands", rows])
    return out


def show(desc: dict, command_path: str, console: Console | None = None) -> None:
    """Print a :func:`describe` d help at the console's width."""
    console = console or Console(highlight=False, soft_wrap=False)
    width = console.width
    console.print(Text.assemble(("Usage: ", "yellow"), (" ".join([command_path, *desc["usage"]]), "bold")))
    console.print("")
    for p in desc["paragraphs"]:
        for line in _wrap([(w, "") for w in p.split()], width - 1):
            console.print(Text.assemble(" ", line))
        console.print("")
    for title, rows in desc["panels"]:
        rows = [(name, [tuple(t) for t in tokens]) for name, tokens in rows]
        console.print(Panel(Group(*option_rows(rows, width - 4)), title=title, title_align="left", border_style="dim",
                            width=width, padding=(0, 1)))


def render(cmd, ctx, console: Console | None = None, full: bool = False) -> None:
    """Print ``cmd``'s help: usage, its doc's paragraphs, then one panel per group of options (the short form for a
    command with ``common`` options unless ``full``)."""
    show(describe(cmd, ctx, full=full), ctx.command_path, console)


def _help_all(ctx, param, value) -> None:
    if value and not ctx.resilient_parsing:
        render(ctx.command, ctx, full=True)
        ctx.exit()


class HelpCommand(TyperCommand):
    """A typer command whose ``--help`` is :func:`render`'s. ``common`` (option names, set by
    ``App.command(common=…)``) makes ``--help`` short — those options, a clause of help each — and adds
    ``--help-all`` for every option, as mergekit and litgpt keep their first screen to the options most runs set
    (issue 80: ≤ 60 lines at 80 columns)."""

    common: tuple[str, ...] = ()
    _help_all_option = None

    def get_params(self, ctx):
        params = super().get_params(ctx)
        if not self.common:
            return params
        if self._help_all_option is None:  # one object: click orders eager callbacks by identity
            from typer._coercion import bool_flag_type_descriptor  # noqa: PLC0415 - as typer's own --help option
            from typer.core import TyperOption  # noqa: PLC0415

            self._help_all_option = TyperOption(
                param_decls=[HELP_ALL], is_flag=True, expose_value=False, is_eager=True, callback=_help_all,
                type_descriptor=bool_flag_type_descriptor(), help="every option of this command, with its full help")
        return [*params, self._help_all_option]

    def format_help(self, ctx, formatter) -> None:
        render(self, ctx)


class HelpGroup(TyperGroup):
    """A typer group whose ``--help`` is :func:`render`'s (options, then its commands)."""

    def format_help(self, ctx, formatter) -> None:
        render(self, ctx)


class App(typer.Typer):
    """A Typer whose commands render their help with :class:`HelpCommand`; ``-h`` is ``--help``."""

    def __init__(self, *args, **kwargs):
        settings = {"help_option_names": ["-h", "--help"], **(kwargs.pop("context_settings", None) or {})}
        super().__init__(*args, context_settings=settings, cls=kwargs.pop("cls", None) or HelpGroup, **kwargs)

    def command(self, *args, cls=None, common: tuple[str, ...] = (), **kwargs):
        cls = cls or HelpCommand
        if common:  # a short --help of these options, --help-all for the rest
            cls = type(cls.__name__, (cls,), {"common": tuple(common)})
        return super().command(*args, cls=cls, **kwargs)
