"""The toolkit's one-line errors about what a user gave (the commands print them as "error: ...", exit 2)."""

from __future__ import annotations


class InputError(ValueError):
    """An input cannot be used: a missing or unreadable file, invalid UTF-8 (with the line), a wrong line count, an
    argument of the API or an option of a command that is out of range."""


def first_line(error: BaseException) -> str:
    """What a one-line error quotes of another error: its first line, or its type when it has no message."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class DataError(InputError):
    """A corpus cannot be read: missing file or column, misaligned files, invalid UTF-8, unknown language."""
