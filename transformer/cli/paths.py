"""The argparse type and action of the commands' file and folder options: an empty value, as an unset shell variable
gives (``--output "$DIR"``), is refused, and so is a second value of an option that takes one. Path("") is the
current folder: ``transformer-export --output '' --force`` replaced it whole, and ``--input ''`` read stdin,
``--output ''`` printed to stdout, ``--report ''`` wrote nothing, unsaid."""

from __future__ import annotations

import argparse


def path_argument(value: str) -> str:
    """``value``, or argparse's error naming the option (one line, `transformer.cli`) when it is empty or blank."""
    if not value.strip():
        raise argparse.ArgumentTypeError("empty value (an unset shell variable?): give a file or folder")
    return value


class GivenOnce(argparse.Action):
    """An option that takes one value and refuses a second (argparse keeps the last, unsaid: ``--model a --model b``
    loaded b, ``transformer-export --checkpoint a --checkpoint b`` exported b)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"argument {option_string}: given twice ({getattr(namespace, self.dest)} and {values}); "
                         f"give it once")
        setattr(namespace, self.dest, values)
