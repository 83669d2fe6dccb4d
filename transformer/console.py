"""The console scripts (``transformer-train`` ...) and ``python -m transformer``, which import the commands inside
their error handling: torch and the rest take about a second to load, and a Ctrl-C meanwhile must print
"interrupted" and exit 130, as it does later, not Python's traceback of the import."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C


def interrupted() -> int:
    """Say that a Ctrl-C ended the command; its exit status (a command's own Ctrl-C says it the same way)."""
    print("interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


def _commands() -> ModuleType | None:
    """`transformer.cli`, or None if a Ctrl-C came while it loaded."""
    try:
        import transformer.cli
    except KeyboardInterrupt:
        return None
    return transformer.cli


def console_script(name: str) -> Callable[[], int]:
    """The console script of the command ``name`` (`transformer.cli.command`)."""
    def run() -> int:
        commands = _commands()
        return interrupted() if commands is None else commands.command(name)(None)

    run.__name__ = run.__qualname__ = name
    return run


def main() -> int:
    """``python -m transformer COMMAND ...``"""
    commands = _commands()
    return interrupted() if commands is None else commands.main()


train, translate, evaluate, average, plot, export, serve = (
    console_script(name) for name in ("train", "translate", "evaluate", "average", "plot", "export", "serve"))
