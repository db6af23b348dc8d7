"""``python -m skillgraft.cli``: the program, as the console script runs it."""

from skillgraft.cli.entry import main

main()
