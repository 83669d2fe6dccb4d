"""Writing a file atomically, with the permissions of any other file the user creates; and a folder whose
new content takes the place of the old only once it is complete (`replacing_folder`).

The file is written under a temporary name beside its destination, flushed to disk and renamed over
it, so that a crash or a full disk leaves the previous file whole. The temporary file is created as an
ordinary file is, mode 0666 less the user's umask (0644 under umask 022, 0664 under 002), and keeps
that mode: `tempfile.mkstemp` makes it 0600, and so do writers that rename their own temporary file
into place (safetensors' ``save_file``), which left checkpoints and release weights that a server
account or a team sharing the run directory could not read.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no locks, so two writers of one folder are not kept apart there
    fcntl = None


@contextmanager
def atomic_write(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for the block to write; when the block ends, the file gets the mode of a
    new ordinary file, is flushed to disk and renamed to ``path``. If the block fails, the temporary file is
    removed and ``path`` is untouched."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any file
    except OSError as error:
        raise _naming(error, path, partial) from error
    mode = stat.S_IMODE(os.fstat(descriptor).st_mode)
    os.close(descriptor)
    try:
        yield partial
        os.chmod(partial, mode)  # the writer may have replaced the file with a 0600 one
        _fsync(partial)
        os.replace(partial, path)
    except BaseException as error:
        partial.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise _naming(error, path, partial) from error
        raise
    _fsync(path.parent)  # make the rename itself durable


def _naming(error: OSError, path: Path, partial: Path) -> OSError:
    """``error`` of writing ``partial`` (a full disk, a read-only folder) as one of writing ``path``: the user's
    file, not a hidden temporary one, or none (a full disk's error names no file). An error naming another file
    (one the writer read) stays as it is."""
    if error.filename not in (None, str(partial)) or error.errno is None:
        return error
    return OSError(error.errno, error.strerror, str(path))


PROBE_SUFFIX = ".probe"  # the end of the name of the file `cannot_write_into` creates and deletes


def cannot_write_into(folder: Path) -> str | None:
    """Why no file can be created in ``folder`` or, where it does not exist yet, in the nearest folder above it
    (a read-only file system, no permission), or None; found by creating one, as the write will, before the long
    work whose output it is (translating a file, exporting a model) rather than after it."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    probe = folder / f".{uuid.uuid4().hex[:12]}{PROBE_SUFFIX}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as error:
        return error.strerror or str(error)
    with contextlib.suppress(OSError):  # a folder that lets files be created and not deleted takes the output too
        probe.unlink()
    return None


def is_probe(path: Path) -> bool:
    """Whether ``path`` is a file `cannot_write_into` created (and a kill kept it from deleting)."""
    return path.name.startswith(".") and path.name.endswith(PROBE_SUFFIX) and path.is_file()


def atomic_copy(source: str | Path, path: str | Path) -> None:
    """A copy of the file ``source`` at ``path``, put in place as `atomic_write` puts a file: a second name for the
    same bytes without making them again (a checkpoint's serialisation and checksum), and a file of its own, so
    that damage to one leaves the other whole."""
    with atomic_write(path) as partial:
        shutil.copyfile(source, partial)


def write_output(path: str | Path, text: str) -> None:
    """Write a user's output file (translations, a report) as UTF-8 ``text``, atomically where it is (or will be) a
    regular file, so that a failed write (a full disk, a kill) leaves the previous file whole instead of cut short;
    it keeps the old file's mode. A device, a FIFO or a symbolic link (--output /dev/stdout) is written through."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(text)
        return
    mode = path.stat().st_mode if path.exists() else None
    with atomic_write(path) as partial:
        partial.write_text(text, encoding="utf-8")
    if mode is not None:
        os.chmod(path, mode)


def _fsync(path: Path) -> None:
    """Flush a file's data, or a directory's entries, to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


PARTIAL_FOLDER = ".partial-"  # the start of the name of the folder `replacing_folder` writes into


@contextmanager
def replacing_folder(output: Path) -> Iterator[Path]:
    """A new folder inside ``output`` (created if missing) for the block to write into; when the block ends, what
    ``output`` held gives way to what was written. If the block fails, the new folder is removed and ``output``
    holds what it held (or is removed, if the block created it and nothing else is there). Inside rather than
    beside: ``output`` may be a mount point, a symbolic link or the current directory, which renaming a folder
    over it would not replace. The new folder is locked while it is written (`being_written`), so that another
    writer leaves it alone: two exports into one folder never mix, the last to end wins."""
    created = not output.exists()
    output.mkdir(parents=True, exist_ok=True)
    partial = output / f"{PARTIAL_FOLDER}{uuid.uuid4().hex[:12]}"
    partial.mkdir()  # the mode of any new folder, where tempfile.mkdtemp's is 0700
    lock = hold(partial)
    try:
        try:
            yield partial
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            if created and not any(output.iterdir()):
                output.rmdir()
            raise
        for old in output.iterdir():
            if old == partial or old.name.startswith(PARTIAL_FOLDER) and being_written(old):
                continue
            shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
        for new in partial.iterdir():
            new.rename(output / new.name)
        partial.rmdir()
    finally:
        if lock is not None:
            os.close(lock)


def being_written(folder: Path) -> bool:
    """Whether a `replacing_folder` still writes into ``folder``; one a killed process left is not (the kernel
    lets go of a dead process's lock)."""
    try:
        lock = hold(folder)
    except BlockingIOError:
        return True
    except OSError:  # gone, or unreadable: not a folder anyone writes into now
        return False
    if lock is not None:
        os.close(lock)
    return False


def hold(folder: Path) -> int | None:
    """A descriptor holding an exclusive lock on ``folder`` until it is closed (or the process ends, however it
    ends); None where there are no locks (not on Windows, nor on some network file systems). Raises
    BlockingIOError where another process holds it, and OSError where ``folder`` cannot be opened."""
    if fcntl is None:
        return None
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise
    except OSError:  # ENOLCK, EOPNOTSUPP: a file system without flock
        os.close(descriptor)
        return None
    return descriptor
