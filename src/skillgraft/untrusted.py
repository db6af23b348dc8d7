"""Reading files that may be damaged or hostile: paths recorded in a file stay inside its folder (:func:`inside`),
YAML is parsed with a bound on what its aliases expand to and no key given twice (:func:`load_yaml`), JSON the same
(:func:`read_json`, :func:`unique_keys`, :data:`TOO_DEEP`); text in the encodings other tools write (:func:`read_text`).
docs/reliability.md §14–§15."""

from __future__ import annotations

import codecs
import json
import os
from pathlib import Path

from skillgraft.errors import SkillgraftError
from skillgraft.errors import describe_io_error
from skillgraft.paths import absolute, path_problem, special_kind


BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def read_text(path: Path) -> str:
    """The text of a file as other tools write it (data files, recipes, configs): UTF-8 with or without a
    byte-order mark, or UTF-16 with one (Windows "Unicode", PowerShell 5's ``>``); CRLF line ends are left to
    the parsers, which all accept them. A NUL byte (a binary file), bytes that are not UTF-8 or an unreadable
    file are one error naming the file and the line."""
    regular(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise SkillgraftError(f"{path}: cannot read ({describe_io_error(e).removeprefix(f'{path}: ')})") from None
    encoding = next((enc for bom, enc in BOMS if raw.startswith(bom)), "utf-8")
    if encoding == "utf-16":
        try:
            return raw.decode("utf-16")
        except UnicodeDecodeError as e:
            raise SkillgraftError(f"{path}: starts with a UTF-16 byte-order mark but is not UTF-16 text "
                                  f"({e.reason} at offset {e.start}); re-save the file as UTF-8") from None
    nul = raw.find(b"\x00")
    if nul >= 0:
        line = raw.count(b"\n", 0, nul) + 1
        raise SkillgraftError(f"{path}:{line}: contains a NUL byte (a binary file?); expected UTF-8 text")
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        start = e.start + (3 if encoding == "utf-8-sig" else 0)
        line = raw.count(b"\n", 0, start) + 1
        raise SkillgraftError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[start]:02x} at offset {start}); "
                              "re-save the file as UTF-8") from None


def regular(path: str | os.PathLike, what: str = "") -> Path:
    """Refuse ``path`` before it is opened when it is (or links to) no regular file and no folder: a named pipe, a
    device, a socket. ``open()`` on a FIFO blocks until a writer comes, deaf to SIGTERM; ``/dev/urandom`` never
    ends, ``/dev/zero`` neither. One line naming the file (and where a link leads); a path that does not exist is
    left to the caller's own "not found". Every reader of a path a user hands in calls this, or :func:`regular_tree`
    for a folder (docs/reliability.md §19)."""
    import stat  # noqa: PLC0415

    try:
        st = os.stat(path)
    except OSError:
        return Path(path)
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return Path(path)
    link = f" (a link to {os.path.realpath(path)})" if os.path.islink(path) else ""
    raise SkillgraftError(f"{path}{link}: {special_kind(st.st_mode)}, not a regular file; refused before opening it "
                          f"(reading it could block or never end){f'; expected {what}' if what else ''}")


TREE_DEPTH = 2  # a model folder's files and one level below (a saved dataset's split folders); never a whole tree


def regular_tree(folder: str | os.PathLike, what: str = "") -> Path:
    """:func:`regular` for a folder a library opens files of (a model checkpoint, a saved dataset): every entry
    down to :data:`TREE_DEPTH` levels, links followed to what they name, must be a regular file or a folder; a file
    is refused as :func:`regular` says. A file is checked as itself."""
    folder = Path(folder)
    regular(folder, what)
    if not folder.is_dir():
        return folder
    stack = [(folder, 0)]
    while stack:
        here, depth = stack.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue  # unreadable: the reader's own error names it
        for entry in entries:
            regular(entry.path, what)
            if depth + 1 < TREE_DEPTH and entry.is_dir(follow_symlinks=False):
                stack.append((Path(entry.path), depth + 1))
    return folder


def no_such(path: str | os.PathLike, what: str, want: str = "file") -> SkillgraftError:
    """The error for a ``path`` that :func:`path_problem` finds wanting: ``<what> not found: <path>`` when it
    does not exist, else ``<path>: <why>; expected <what>``."""
    why = path_problem(path, want) or "not readable"
    if why == "not found":
        return SkillgraftError(f"{what} not found: {path}")
    return SkillgraftError(f"{path}: {why}; expected {'a ' if not what.startswith(('a ', 'an ')) else ''}{what}")


TOO_DEEP = "values nested deeper than a reader follows (thousands of levels); refused"  # RecursionError's line


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``' ``object_pairs_hook``: the object, or a ``ValueError`` for a key given twice in it (JSON
    parsers keep the last silently; the file almost certainly holds a mistake)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} is given twice in one object; give each key once")
        out[key] = value
    return out


def read_json(path: str | os.PathLike, *, required: tuple[str, ...] = (), what: str = "file") -> dict:
    """A JSON object from ``path``; missing file, bad JSON or a missing ``required`` key → one clear error."""
    path = Path(path)
    if not path.is_file():
        raise no_such(path, what)
    try:
        obj = json.loads(read_text(path), object_pairs_hook=unique_keys)
    except json.JSONDecodeError as e:
        raise SkillgraftError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except ValueError as e:  # a key given twice (unique_keys)
        raise SkillgraftError(f"{path}: {e}") from None
    except RecursionError:
        raise SkillgraftError(f"{path}: {TOO_DEEP}") from None
    if required and not isinstance(obj, dict):
        raise SkillgraftError(f"{path}: unreadable {what} (expected a JSON object, got {type(obj).__name__})")
    missing = [k for k in required if k not in obj]
    if missing:
        raise SkillgraftError(f"{path}: unreadable {what} (missing field(s) {missing})")
    return obj


def inside(folder: str | os.PathLike, value, source: str | os.PathLike, field: str) -> Path:
    """``folder / value`` for a path ``value`` recorded in the file ``source`` (``field``: where in it), when it is
    a relative path that stays inside ``folder`` once links and ``..`` are resolved; anything else — absolute,
    ``..`` out of it, a link leading out, not text — is one error naming the file, the field and the value: a file
    skillgraft wrote names only its own folder's parts, so a path leading elsewhere is a damaged or planted file
    (before, a continual state's ``owned: "../x"`` made ``continual add`` write outside ``--state``)."""
    if not isinstance(value, str) or not value.strip():
        raise SkillgraftError(f"{source}: field {field!r} must be a relative path inside {folder}, got {value!r}")
    if os.path.isabs(value) or absolute(folder) not in absolute(Path(folder) / value).parents:
        raise SkillgraftError(f"{source}: field {field!r} = {value!r} leads outside its folder {folder}; a file "
                              "skillgraft wrote names only paths inside it (damaged or planted?): refused, nothing "
                              "read or written")
    return Path(folder) / value


YAML_MAX_VALUES = 100_000  # values a YAML file may expand to, aliases followed (a config holds a few hundred)


def load_yaml(path: str | os.PathLike, text: str | None = None):
    """The YAML document of ``path`` (its text read as :func:`read_text` does: UTF-8 with or without a BOM, or
    UTF-16), parsed with ``yaml.SafeLoader``'s types only, and refused — one error naming the file and the line —
    when a mapping gives a key twice (YAML says keys are unique; PyYAML silently keeps the last) or when aliases
    expand it beyond :data:`YAML_MAX_VALUES` values (a "billion laughs" file of a few hundred bytes, which
    exhausted memory) or into themselves. Bad YAML: ``yaml.YAMLError``, for the caller to describe."""
    import yaml  # noqa: PLC0415

    path = Path(path)
    text = read_text(path) if text is None else text

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base`, whose keys the mapping may override
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise SkillgraftError(f"{path}:{line}: key {key!r} is given twice (first on line "
                                              f"{seen[key]}); give each key once")
                    seen[key] = line
                except TypeError:
                    continue  # an unhashable key: the constructor's own error follows
            return super().construct_mapping(node, deep=deep)

    loader = Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _bounded(node, path)
        return loader.construct_document(node)
    except RecursionError:
        raise SkillgraftError(f"{path}: {TOO_DEEP}") from None
    finally:
        loader.dispose()


def _bounded(root, path: Path) -> None:
    """Refuse a YAML node graph whose expansion (aliases followed) exceeds :data:`YAML_MAX_VALUES`, or loops."""
    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def size(node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in busy:
            raise SkillgraftError(f"{path}:{node.start_mark.line + 1}: an alias refers to the value that holds it "
                                  "(a value without end); refused")
        busy.add(key)
        children = node.value if isinstance(node.value, list) else []
        total = 1
        for child in children:
            for part in (child if isinstance(child, tuple) else (child,)):
                total += size(part)
                if total > YAML_MAX_VALUES:
                    raise SkillgraftError(f"{path}:{node.start_mark.line + 1}: its aliases expand to more than "
                                          f"{YAML_MAX_VALUES:,} values (a YAML alias bomb?); refused before it is "
                                          "built")
        busy.discard(key)
        sizes[key] = total
        return total

    size(root)


# torch's weights-only unpickler had code-execution bugs before 2.10 (CVE-2025-32434 in ≤ 2.5.1, and later ones); the
# project pins 2.13. Every site that reads a pickle (.pt / .bin) goes through torch_load, which asserts the floor.
TORCH_FLOOR = (2, 10)
PICKLE_REFUSED = ("holds objects other than tensors, numbers and text (code would run if it were unpickled); "
                  "refused, not read")


def torch_floor() -> None:
    """Refuse to read a pickle under a torch older than :data:`TORCH_FLOOR` (its weights-only loading could run code)."""
    import torch  # noqa: PLC0415

    found = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if found < TORCH_FLOOR:
        raise SkillgraftError(f"torch {torch.__version__} is older than {'.'.join(map(str, TORCH_FLOOR))}, whose "
                              "weights-only loading of .pt / .bin files could run code; skillgraft reads no pickle "
                              "with it: install the pinned torch (requirements.lock)")


def torch_load(path: str | os.PathLike, *, mmap: bool = False):
    """``torch.load(path, weights_only=True)`` once :func:`torch_floor` holds: tensors, numbers, text and containers
    only. A pickle that would run code raises ``pickle.UnpicklingError`` (never run); the caller says so with
    :data:`PICKLE_REFUSED`, never advising ``weights_only=False``."""
    import torch  # noqa: PLC0415

    torch_floor()
    return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def refused_pickle(e: BaseException) -> bool:
    """Whether ``e`` is the weights-only unpickler refusing what a pickle holds (not a truncated file)."""
    import pickle  # noqa: PLC0415

    return isinstance(e, pickle.UnpicklingError) and ("weights_only" in str(e) or "Unsupported global" in str(e))
