"""The walk of one ``skillgraft graft`` run (issue 47): which source files of skillgraft it runs code in, in how
many folders, and how many calls climb back to a higher layer (cli → recipes → verbs → pipeline → cores → models →
data → the top-level helpers): a call from a lower layer's file into a higher one's, e.g. a core reading a
``pipeline`` object's property, or a pipeline stage calling back a verb's function.

    PYTHONPATH=src:tests python bench/graft_walk.py          # a tiny BERT, 2 localization steps, one baseline
    PYTHONPATH=src:tests python bench/graft_walk.py --lines  # the distinct lines the run executes, per file

Prints the counts and each climbing edge (caller → callee, with how often); ``--lines`` instead traces every line
event (lazy.py and spec.py included) and prints, per file, the lines executed beside the lines the file holds."""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

import skillgraft

SRC = Path(skillgraft.__file__).parent
RANK = {"cli": 0, "recipes": 1, "verbs": 2, "pipeline": 3, "graft": 4, "keep": 4, "merge": 4, "export": 4, "train": 4,
        "fisher": 4, "evaluate": 4, "models": 5, "data": 6, "keep/stats": 6.5}  # keep's statistics: a low floor
# a call through these is made by the frame below them: lazy.py's stand-ins (``@no_grad`` wraps the function it
# decorates) and spec.py's Spec base (``Spec.build`` runs a subclass's own validators, through pydantic)
TRANSPARENT = (None, "lazy.py", "spec.py")
RESUMABLE = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async generator


def layer(rel: str) -> int:
    """The layer rank of a source file (``verbs/graft.py`` → 2; ``keep/stats/bound.py`` → keep/stats' 6.5);
    top-level helpers (io.py, lazy.py, …) are last."""
    parts = rel.split("/")
    if len(parts) == 1:
        return 0 if parts[0] == "cli" else 7
    return RANK.get("/".join(parts[:2]), RANK.get(parts[0], 7))  # a sub-folder may sit on its own floor


def walk(calls: list[tuple]) -> dict:
    """Files, folders and climbs of a trace of ``(caller file, callee file, …)`` (paths relative to the package)."""
    files = {c[1] for c in calls}
    climbs = Counter(c[:2] for c in calls if c[0] is not None and c[0] != c[1] and layer(c[0]) > layer(c[1]))
    where = Counter(f"{c[0]} → {c[1]}:{c[2]}" for c in calls if c[:2] in climbs)
    folders = {f.split("/")[0] if "/" in f else "." for f in files}
    return {"files": len(files), "folders": len(folders), "climbs": sum(climbs.values()),
            "climbing_edges": len(climbs), "edges": climbs,
            "functions": where, "walked": Counter(c[1] for c in calls)}


def trace(fn, *args, **kw) -> list[tuple[str | None, str, str]]:
    """Every call into a skillgraft source file while ``fn`` runs: ``(caller's file, its file, function)`` (caller
    None: from outside, or a generator resumed)."""
    calls: list[tuple[str | None, str, str]] = []
    root = str(SRC) + "/"

    def rel(frame):
        f = frame.f_code.co_filename if frame is not None else ""
        return f[len(root):] if f.startswith(root) else None

    def caller(frame):
        """The nearest skillgraft frame below ``frame`` (through torch, contextlib, …), lazy.py's stand-ins being
        transparent (``@no_grad`` wraps the function it decorates)."""
        frame = frame.f_back
        while frame is not None and rel(frame) in TRANSPARENT:
            frame = frame.f_back
        return rel(frame)

    def profile(frame, event, arg):
        if event == "call":
            callee = rel(frame)
            if callee is not None and callee not in TRANSPARENT:
                resumed = frame.f_code.co_flags & RESUMABLE  # a generator resumed: by whoever iterates it
                calls.append((None if resumed else caller(frame), callee, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        fn(*args, **kw)
    finally:
        sys.setprofile(None)
    return calls


def executed_lines(fn, *args, **kw) -> dict[str, set[int]]:
    """The distinct line numbers executed in each skillgraft source file while ``fn`` runs (``sys.settrace``)."""
    root = str(SRC) + "/"
    seen: dict[str, set[int]] = {}

    def local(frame, event, arg):
        if event == "line":
            seen.setdefault(frame.f_code.co_filename[len(root):], set()).add(frame.f_lineno)
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(root) else None

    sys.settrace(tracer)
    try:
        fn(*args, **kw)
    finally:
        sys.settrace(None)
    return seen


def main() -> None:
    from tiny import build_tiny, write_sentiment_data

    from skillgraft.data.spec import DataSpec
    from skillgraft.graft.localizers import LocalizeConfig
    from skillgraft.models.spec import ModelSpec
    from skillgraft.train import FinetuneConfig
    from skillgraft.verbs.finetune import finetune
    from skillgraft.verbs.graft import GraftInputs, ReportSpec, graft

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = build_tiny("bert", tmp / "bert")
        data = write_sentiment_data(tmp / "data")
        spec = DataSpec.build({"task": "SST-2", "k": 8, "seed": 13, "data_dir": str(data), "test_limit": 8}, where="-")
        cfg = FinetuneConfig.build({"optimizer": "adamw", "lr": 1e-3, "steps": 6, "eval_every": 3}, where="-")
        run = finetune(spec, ModelSpec.build({"model": str(model)}, where="-"), cfg, out=tmp / "ft").out
        options = LocalizeConfig.build({"budgets": ["0.01"], "steps": 2, "eval_every": 1}, where="-")
        how = executed_lines if "--lines" in sys.argv else trace
        calls = how(graft, GraftInputs(run, data=DataSpec(data_dir=str(data))),
                      report=ReportSpec(baselines=["movement"], lottery_zero=False), localize=options,
                      out=tmp / "g", cache=tmp / "store")
    if "--lines" in sys.argv:
        held = {f: len((SRC / f).read_text().splitlines()) for f in calls}
        print(f"one graft run executes {sum(map(len, calls.values())):,} distinct lines in {len(calls)} files, "
              f"which hold {sum(held.values()):,} lines")
        for f, lines in sorted(calls.items(), key=lambda x: -len(x[1])):
            print(f"  {len(lines):5d} of {held[f]:5d}  {f}")
        return
    w = walk(calls)
    print(f"one graft run: {w['files']} files in {w['folders']} folders; {w['climbs']} calls climb back to a higher "
          f"layer over {w['climbing_edges']} caller → callee file pairs")
    for (a, b), n in sorted(w["edges"].items(), key=lambda x: -x[1]):
        print(f"  {n:6d}  {a} → {b}")
    if "-v" in sys.argv:
        for key, n in w["functions"].most_common():
            print(f"  {n:6d}  {key}")
        for f, n in sorted(w["walked"].items()):
            print(f"  {n:6d}  calls into {f}")


if __name__ == "__main__":
    main()
