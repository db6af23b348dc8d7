"""The one base of every verb's result (:class:`VerbResult`): typed fields the command line prints from, and
:meth:`VerbResult.document`, the verb's report as one mapping — what ``--json`` prints (the CLI only makes its values
JSON: paths as text, NaN as null). A verb's result says what its document holds; the command line reads no result
by key."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar


@dataclasses.dataclass
class VerbResult:
    """Base of a verb's typed result (a dataclass). ``document()``: its fields in order, without those named in
    ``private`` (what the command line prints from but ``--json`` never held); a verb whose document has another
    shape overrides it."""

    private: ClassVar[tuple[str, ...]] = ()

    def document(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self.private}
