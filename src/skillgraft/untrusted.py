"""Reading files that may be damaged or hostile: paths recorded in a file stay inside its folder (:func:`inside`),
YAML is parsed with a bound on what its aliases expand to and no key given twice (:func:`load_yaml`); JSON's
counterparts (:func:`skillgraft.io.unique_keys`, :data:`skillgraft.io.TOO_DEEP`) live beside ``read_json``.
docs/reliability.md §14–§15."""

from __future__ import annotations

import os
from pathlib import Path

from skillgraft.errors import SkillgraftError
from skillgraft.io import TOO_DEEP, _absolute, read_text


def inside(folder: str | os.PathLike, value, source: str | os.PathLike, field: str) -> Path:
    """``folder / value`` for a path ``value`` recorded in the file ``source`` (``field``: where in it), when it is
    a relative path that stays inside ``folder`` once links and ``..`` are resolved; anything else — absolute,
    ``..`` out of it, a link leading out, not text — is one error naming the file, the field and the value: a file
    skillgraft wrote names only its own folder's parts, so a path leading elsewhere is a damaged or planted file
    (before, a continual state's ``owned: "../x"`` made ``continual add`` write outside ``--state``)."""
    if not isinstance(value, str) or not value.strip():
        raise SkillgraftError(f"{source}: field {field!r} must be a relative path inside {folder}, got {value!r}")
    if os.path.isabs(value) or _absolute(folder) not in _absolute(Path(folder) / value).parents:
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
