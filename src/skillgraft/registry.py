"""One registry mechanism for every family of plug-ins (localizers, merge methods, exporters): a name → instance
table filled by a class decorator, and a lookup whose error lists the known names."""

from __future__ import annotations

from typing import Generic, TypeVar

from skillgraft.errors import SkillgraftError

T = TypeVar("T")


class Registry(Generic[T]):
    """``members`` maps a name to the one instance of a registered subclass of ``base``.

    ``noun`` names a member in errors ("localizer"), ``article`` goes before it ("a" / "an"), ``lookup`` names
    what an unknown name was looked up as ("export target")."""

    def __init__(self, base: type, noun: str, *, article: str = "a", lookup: str | None = None):
        self.base, self.noun, self.article, self.lookup = base, noun, article, lookup or noun
        self.members: dict[str, T] = {}

    def register(self, name: str, *, replace: bool = False):
        """Class decorator: register a ``base`` subclass under ``name`` (its instance is the member)."""
        def add(cls):
            if not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise SkillgraftError(f"{self.noun} {name!r} must be a {self.base.__name__} subclass, got {cls!r}")
            if name in self.members and not replace:
                raise SkillgraftError(f"{self.article} {self.noun} named {name!r} is already registered")
            cls.name = name
            self.members[name] = cls()
            return cls
        return add

    def get(self, name: str) -> T:
        """The member ``name`` (a clear error listing the known names otherwise)."""
        if name not in self.members:
            raise SkillgraftError(f"unknown {self.lookup} {name!r}; known: {', '.join(self.members)}")
        return self.members[name]
