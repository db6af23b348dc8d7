"""The command line (``skillgraft <verb>``): parses options and prints each verb's typed result; no work, no defaults.

``commands.py`` the verbs' commands (one module per verb group: ``train.py``, ``graft.py``, ``use.py``,
``merge.py``, ``continual.py``, ``recipes.py``, on the app of ``group.py``), ``options.py`` options generated from
the typed specs, ``help.py`` the 80-column ``--help``, ``config.py`` ``--config FILE``, ``output.py`` what is
printed, ``errors.py`` the one-line error contract, ``entry.py`` the console script. ``app``, ``main`` and ``region_table`` come from ``commands.py``
on first use (a module named ``app`` would shadow the Typer app), so ``skillgraft --version`` imports no command
line.
"""

from skillgraft.lazy import lazy_exports

__all__ = ["app", "main", "region_table"]
__getattr__ = lazy_exports(__name__, {"app": "skillgraft.cli.commands", "main": "skillgraft.cli.commands",
                                      "region_table": "skillgraft.cli.commands"})
