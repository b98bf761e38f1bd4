"""A Python process where importing FastStream raises: the standalone worker runs in one.

``refuse_faststream(directory)`` writes a ``sitecustomize.py`` there whose import finder
refuses ``faststream`` and ``fast_depends`` (and writes down each name it refused); put
the directory first on ``PYTHONPATH`` of the process. It writes down that it was
installed too, so a test can tell "nothing tried to import FastStream" from "the finder
never ran".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tests.cli import ROOT

_SITECUSTOMIZE = """
import importlib.abc
import sys


class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("faststream", "fast_depends"):
            with open(__file__ + ".tried", "a") as tried:
                tried.write(name + "\\n")
            raise ImportError(f"importing {name} is refused here")
        return None


sys.meta_path.insert(0, _Refuse())
with open(__file__ + ".loaded", "a") as loaded:
    loaded.write("installed\\n")
"""


@dataclass(frozen=True)
class Refusal:
    """The directory of the refusing ``sitecustomize.py``, and what it wrote down."""

    directory: Path

    @property
    def pythonpath(self) -> str:
        """Return ``PYTHONPATH`` for a process that refuses FastStream and runs this checkout."""
        return f"{self.directory}{os.pathsep}{ROOT}"

    @property
    def installed(self) -> bool:
        """Return whether a process installed the finder."""
        return (self.directory / "sitecustomize.py.loaded").exists()

    @property
    def tried(self) -> str:
        """Return the names a process tried to import and was refused, one a line."""
        tried = self.directory / "sitecustomize.py.tried"
        return tried.read_text() if tried.exists() else ""


def refuse_faststream(directory: Path) -> Refusal:
    """Write the refusing ``sitecustomize.py`` into ``directory`` (created)."""
    directory.mkdir(parents=True)
    (directory / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return Refusal(directory)
