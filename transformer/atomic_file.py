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

import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_write(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for the block to write; when the block ends, the file gets the mode of a
    new ordinary file, is flushed to disk and renamed to ``path``. If the block fails, the temporary file is
    removed and ``path`` is untouched."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any file
    mode = stat.S_IMODE(os.fstat(descriptor).st_mode)
    os.close(descriptor)
    try:
        yield partial
        os.chmod(partial, mode)  # the writer may have replaced the file with a 0600 one
        _fsync(partial)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    _fsync(path.parent)  # make the rename itself durable


def _fsync(path: Path) -> None:
    """Flush a file's data, or a directory's entries, to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextmanager
def replacing_folder(output: Path) -> Iterator[Path]:
    """A new folder inside ``output`` (created if missing) for the block to write into; when the block ends, what
    ``output`` held gives way to what was written. If the block fails, the new folder is removed and ``output``
    holds what it held (or is removed, if the block created it). Inside rather than beside: ``output`` may be a
    mount point, a symbolic link or the current directory, which renaming a folder over it would not replace."""
    created = not output.exists()
    output.mkdir(parents=True, exist_ok=True)
    partial = output / f".partial-{uuid.uuid4().hex[:12]}"
    partial.mkdir()  # the mode of any new folder, where tempfile.mkdtemp's is 0700
    try:
        yield partial
    except BaseException:
        shutil.rmtree(output if created else partial, ignore_errors=True)
        raise
    for old in output.iterdir():
        if old != partial:
            shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    for new in partial.iterdir():
        new.rename(output / new.name)
    partial.rmdir()
