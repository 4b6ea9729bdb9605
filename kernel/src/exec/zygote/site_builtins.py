# The builtins the site module would add — help, exit and quit — without
# importing site (the interpreter runs with -S). Installed in the zygote
# before it forks, so every run has them. help() imports pydoc only when a
# run calls it: pydoc and what it imports (about 5 MB) in the zygote's
# image would make every run's fork and exit slower, help or not (a fork
# to exit, 0.5 ms, took half as long again). help() writes to
# the run's stdout and never starts a pager or reads a terminal: a run has
# neither.

import builtins
import sys


def install_site_builtins():
    """Puts help, exit and quit into builtins, for every run forked from
    here."""
    builtins.help = RunHelp()
    builtins.exit = Quitter("exit")
    builtins.quit = Quitter("quit")


class RunHelp:
    """pydoc's help, writing to whatever sys.stdout is when it is called.
    With no argument it prints its introduction and returns: interactive
    help reads an empty input, so it never waits."""

    def __repr__(self):
        return "Type help() for interactive help, or help(object) for help about object."

    def __call__(self, *args, **kwargs):
        import io
        import pydoc

        # pydoc pages whatever is not written to an explicit output (help
        # on True, False and None, some topics).
        pydoc.pager = write_to_stdout
        return pydoc.Helper(input=io.StringIO(""), output=None)(*args, **kwargs)


def write_to_stdout(text, title=""):
    """pydoc's pager for a run: the text, undecorated, on stdout."""
    import pydoc

    sys.stdout.write(pydoc.plain(text))
    if not text.endswith("\n"):
        sys.stdout.write("\n")


class Quitter:
    """exit() and quit(): end the run with the given status, as SystemExit
    does."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Use {self.name}() to end the run"

    def __call__(self, code=None):
        raise SystemExit(code)
