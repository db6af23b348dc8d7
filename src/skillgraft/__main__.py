"""``python -m skillgraft``: the program, as the console script runs it."""

from skillgraft.cli.entry import main

main()
