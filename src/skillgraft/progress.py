"""The one owner of progress bars, whatever the entry point (the CLI, the Python API, a recipe): :func:`bar` is
tqdm.auto's bar, live on a terminal and, written to a file or a CI log, one line per phase when it ends (and one
every :data:`LINE_EVERY_S` while a long phase runs), never a carriage-return refresh per update."""

from __future__ import annotations

LINE_EVERY_S = 300.0  # a phase logged to a file: its state every 5 minutes while it runs, and when it ends


def _terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def lines_when_logged() -> None:
    """Progress bars writing to a stream that is not a terminal (``make demo > log``, a CI log, a script's
    ``2> log``) print one line per phase, when it ends, instead of a carriage-return refresh per update (hundreds
    per phase, and the last state twice: the last refresh and the closing draw); a bar that vanishes when done on a
    terminal (``leave=False``, a nested one) leaves its one line too, and a phase that runs longer than
    :data:`LINE_EVERY_S` also writes its state that often. On a terminal, tqdm as usual. Installed once on tqdm's
    own class, so every bar (skillgraft's, transformers', accelerate's) follows its stream; :func:`bar` installs
    it, so the Python API logs as the CLI does."""
    from tqdm import std  # noqa: PLC0415

    if getattr(std.tqdm, "_skillgraft_lines", False):
        return
    display, clear = std.tqdm.display, std.tqdm.clear

    def line_display(self, msg=None, pos=None):
        if _terminal(self.fp):
            return display(self, msg, pos)
        if not self.disable:  # running (close() disables first): a line only every LINE_EVERY_S seconds
            start, now = getattr(self, "start_t", None), self._time()  # no start_t at the draw inside tqdm's __init__
            if start is not None and now - getattr(self, "_line_t", start) >= LINE_EVERY_S:
                self._line_t = now
                self.fp.write(self.__str__() + "\n")
                getattr(self.fp, "flush", lambda: None)()
            return False
        if getattr(self, "_line_done", False):  # closed twice (close() after an iteration's own close): one line
            return False
        self._line_done = True
        if msg is None:  # close() of a bar that stays: its final state, close() ends the line
            self.fp.write(self.__str__())
            return True
        self.fp.write(self.__str__() + "\n")  # close() of a bar that would vanish (leave=False, nested): its line
        return False

    def line_clear(self, nolock=False):
        if _terminal(self.fp):
            return clear(self, nolock)
        return None

    std.tqdm.display, std.tqdm.clear = line_display, line_clear
    std.tqdm._skillgraft_lines = True


def bar(*args, **kwargs):
    """A progress bar (``tqdm.auto.tqdm``'s arguments) that logs as :func:`lines_when_logged` says."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    lines_when_logged()
    return tqdm(*args, **kwargs)
