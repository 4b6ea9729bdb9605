# The builtins the site module would add — help, exit and quit — without
# importing site (the interpreter runs with -S). Installed once in the
# zygote, before it forks, so every run has them at no cost of its own.
# help() writes to the run's stdout and never starts a pager or reads a
# terminal: a run has neither.

import builtins
import io
import pydoc
import sys


def install_site_builtins():
    """Puts help, exit and quit into builtins, for every run forked from
    here."""
    # pydoc pages whatever is not written to an explicit output (help on
    # True, False and None, some topics); a run has no terminal to page on.
    pydoc.pager = write_to_stdout
    builtins.help = RunHelp()
    builtins.exit = Quitter("exit")
    builtins.quit = Quitter("quit")


def write_to_stdout(text, title=""):
    """pydoc's pager for a run: the text, undecorated, on stdout."""
    sys.stdout.write(pydoc.plain(text))
    if not text.endswith("\n"):
        sys.stdout.write("\n")


class RunHelp(pydoc.Helper):
    """pydoc's help, writing to whatever sys.stdout is when it is called.
    With no argument it prints its introduction and returns: interactive
    help reads an empty input, so it never waits."""

    def __init__(self):
        super().__init__(input=io.StringIO(""), output=None)

    def __repr__(self):
        return "Type help() for interactive help, or help(object) for help about object."

    def __call__(self, *args, **kwargs):
        # A fresh, empty input each time: one help() cannot use it up for
        # the next.
        self._input = io.StringIO("")
        return super().__call__(*args, **kwargs)


class Quitter:
    """exit() and quit(): end the run with the given status, as SystemExit
    does."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Use {self.name}() to end the run"

    def __call__(self, code=None):
        raise SystemExit(code)
