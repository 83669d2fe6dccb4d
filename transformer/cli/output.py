"""What the commands that print or write results share: an output file checked before any work, and a quiet end
when the reader of stdout goes away (``| head -1``), as other Unix tools end: a closed pipe is the reader's choice,
not an error to report."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from transformer.atomic_file import cannot_write_into
from transformer.errors import InputError, first_line

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a tool that a closed pipe ended (| head -1)


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit does not fail on the closed pipe."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # not a file descriptor (a test's capture): nothing is flushed to a pipe
        pass


def unwritable(flag: str, path: str | Path, error: OSError) -> InputError:
    """The one-line error of an output file (given as ``flag``) that could not be written after the work (a full
    disk): naming the option and the file, not the temporary one written first."""
    return InputError(f"{flag} {path}: cannot write it ({error.strerror or first_line(error)})")


def write_stdout(text: str, what: str) -> None:
    """Write ``what`` (the translations, the scores) to stdout, flushed here; a failure but a closed pipe (a full
    disk behind a redirection) is a one-line error naming it, not a bare "[Errno 28]"."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as error:
        silence_stdout()  # else the interpreter's last flush at exit fails again, with a traceback
        raise InputError(f"cannot write {what} to standard output ({error.strerror or first_line(error)})") from None


def check_output(path: str | None, flag: str, reads: Sequence[str | Path] = ()) -> None:
    """Refuse, before any work, an output file that could not be written after it, or that is one of the
    files the command ``reads`` (or another of its outputs), which writing it would destroy (a one-line error)."""
    if not path:
        return
    output, folder = Path(path), Path(path).absolute().parent
    if output.is_dir() or not folder.is_dir():
        raise InputError(f"{flag} {path}: " + ("a directory" if output.is_dir() else f"no directory {folder}"))
    if any(output.resolve() == Path(other).resolve() for other in reads):
        raise InputError(f"{flag} {path}: that is a file this command reads or writes already")
    if output.is_symlink() or (output.exists() and not output.is_file()):  # written through (`write_output`)
        return
    reason = cannot_write_into(folder)
    if reason:  # said now, not after translating the whole input
        raise InputError(f"{flag} {path}: cannot write into {folder} ({reason})")
