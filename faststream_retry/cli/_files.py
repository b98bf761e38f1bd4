"""Files the commands write: whole or not at all, and never over one that was not given up.

An export may be the only copy of dead letters a purge removed. So it is written to a
temporary file beside its target and moved into place only once complete: a wrong queue
name, a broker gone mid-way, Ctrl-C or a ``kill -9`` leave an existing file byte for byte
as it was, and no new one. An existing file is replaced only when asked (``--force``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["STDOUT", "FileRefusedError", "check_target", "written"]

STDOUT = "-"
PARTIAL = ".partial-"
"""In the name of a file being written (``.<name>.partial-<random>``): a ``kill -9``
leaves one behind, never a half-written file under the target's name."""


class FileRefusedError(Exception):
    """The file cannot or must not be written; the text says why and what to do."""


def check_target(path: str, *, force: bool) -> None:
    """Refuse ``path`` before any work: an existing file without ``force``, no such folder.

    Raises:
        FileRefusedError: why ``path`` will not be written.
    """
    if path == STDOUT:
        return
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise FileRefusedError(f"{path} is a folder: give a file name")
    if target.exists() and not force:
        raise FileRefusedError(
            f"{path} exists, and may be the only copy of dead letters a purge removed: "
            "nothing was read or written. Give another name, or --force to replace it "
            "once the new export is complete"
        )
    folder = target.parent
    if not folder.is_dir():
        raise FileRefusedError(f"cannot write {path}: there is no folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise FileRefusedError(f"cannot write {path}: the folder {folder} is not writable")


@contextmanager
def written(path: str, *, force: bool) -> Iterator[TextIO]:
    """Yield a stream for ``path`` that becomes ``path`` only if the block ends normally.

    ``-`` is stdout, written as it goes. Otherwise the text goes to a temporary file in
    the same folder (so the move is a rename, atomic on one file system), flushed to
    disk, then renamed over ``path`` (``force``) or linked to it, which fails rather than
    replace a file that appeared meanwhile. On any exception the temporary file goes.

    Raises:
        FileRefusedError: ``path`` exists (without ``force``) or cannot be written.
    """
    if path == STDOUT:
        try:
            yield sys.stdout
            sys.stdout.flush()
        except BaseException:
            _silence_stdout()
            raise
        return
    check_target(path, force=force)
    # A link is kept: the file it points to is what is written (and replaced).
    target = Path(os.path.realpath(path))
    fd, partial = tempfile.mkstemp(prefix=f".{target.name}{PARTIAL}", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as stream:
            # As open() would make it: mkstemp's 0600 would surprise whoever reads exports.
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(stream.fileno(), 0o666 & ~umask)
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        _into_place(Path(partial), target, force=force)
    finally:
        with contextlib.suppress(FileNotFoundError):
            Path(partial).unlink()


def _silence_stdout() -> None:
    """Point stdout at /dev/null once an export to it failed.

    A reader gone (``| head``) would make the flush at exit print a second error.
    """
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _into_place(partial: Path, target: Path, *, force: bool) -> None:
    """Give the complete file ``partial`` the name ``target``."""
    if force:
        partial.replace(target)
        return
    try:
        os.link(partial, target)
    except FileExistsError:
        raise _appeared(target) from None
    except OSError:
        # A file system without hard links: the check and the rename are two steps.
        if target.exists():
            raise _appeared(target) from None
        partial.replace(target)


def _appeared(target: Path) -> FileRefusedError:
    return FileRefusedError(
        f"{target} appeared while the export ran: it was left as it is, and the export was "
        "not saved. Run it again with another name"
    )
