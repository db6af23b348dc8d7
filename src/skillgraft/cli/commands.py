"""The command line: ``skillgraft <verb>``. Each verb is a thin wrapper over a typed library function.

Options that configure the work come from the typed specs (``options.from_specs``): their names, defaults,
ranges and help are declared once, on the spec's fields. The commands live one module per verb group
(``cli/train.py``: finetune, evaluate, fim; ``cli/graft.py``: graft, sweep, localizers; ``cli/use.py``: apply,
inspect, export, serve; ``cli/merge.py``; ``cli/continual.py``; ``cli/recipes.py``: tasks, run, demo), each
registering on the one app of ``cli/group.py``; this module puts them in the order ``--help`` lists them.
"""

from __future__ import annotations

from skillgraft.cli.continual import continual_add_cmd, continual_show_cmd
from skillgraft.cli.graft import graft, localizers, sweep
from skillgraft.cli.group import app
from skillgraft.cli.merge import merge
from skillgraft.cli.options import guard_empty_paths
from skillgraft.cli.output import region_table, run_app
from skillgraft.cli.recipes import demo, run_cmd, tasks
from skillgraft.cli.train import evaluate, finetune, fim
from skillgraft.cli.use import apply, export_cmd, inspect, serve

# the order of `skillgraft --help`
ORDER = (tasks, finetune, evaluate, run_cmd, graft, apply, inspect, serve, export_cmd, localizers, sweep, merge, demo,
         fim)
_RANK = {fn.__name__: i for i, fn in enumerate(ORDER)}
app.registered_commands.sort(key=lambda c: _RANK.get(c.callback.__name__, len(ORDER)))

guard_empty_paths(app)  # every path option refuses '' (an unset variable) by name

__all__ = ["app", "continual_add_cmd", "continual_show_cmd", "main", "region_table", *(fn.__name__ for fn in ORDER)]


def main() -> None:  # pragma: no cover - entry point
    """Entry point of ``skillgraft``: the app under the one-line error contract (:func:`output.run_app`)."""
    run_app(app)


if __name__ == "__main__":  # pragma: no cover
    main()
