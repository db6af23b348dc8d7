"""The console script's path before the command line became the ``cli`` package (``skillgraft.entry:main``), kept
for launchers that still name it (``../shared/gpu/probe.sh`` writes one on the GPU machine)."""

from skillgraft.cli.entry import main

__all__ = ["main"]
