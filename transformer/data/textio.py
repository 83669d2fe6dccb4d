"""Reading user text files: UTF-8, one sentence per line, with errors that name the line."""

from __future__ import annotations

from pathlib import Path

from transformer.errors import InputError

BOM = "\ufeff".encode()
STDIN = "-"  # a file option's name for standard input (or output): --hypotheses -, --input -


def split_lines(data: bytes, name: str) -> list[str]:
    """Split on "\\n" only (other Unicode line breaks stay inside their line), drop a final "\\r" and a
    leading byte-order mark (which editors on Windows write, and which would otherwise reach the model
    as three byte pieces and change the first translation).

    Translation keeps exactly one output line per input line, so only the byte that ends a line
    in the file may split it.
    """
    lines = data.removeprefix(BOM).split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [decode_line(line, f"{name} line {number}") for number, line in enumerate(lines, start=1)]


def decode_line(line: bytes, where: str) -> str:
    """One line's UTF-8 bytes (without its "\\n") as text, without a final "\\r"; ``where`` names it in the error."""
    try:
        return line.decode("utf-8").removesuffix("\r")
    except UnicodeDecodeError:
        raise InputError(f"{where}: invalid UTF-8") from None


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file (see `split_lines`)."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror}") from None
    return split_lines(data, str(path))
