"""Print the mutation score of the pure core and fail below the floor.

Reads what ``mutmut run`` left in ``mutants/`` and the list of equivalent mutants in
``tests/equivalent_mutants.txt``. The score counts only mutants that are not listed
there: ``killed / (all - equivalent)``. It fails when

- the score is below ``FLOOR`` (raise it as the suites improve, never lower it), or
- a listed mutant no longer survives, or its mutated line is no longer what the list
  says (a function was edited and its mutants renumbered: read them again).

Surviving mutants that are not listed are printed with their diff: kill them with a test,
or list them with the reason no test can.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

FLOOR = 100.0
"""Percent of non-equivalent mutants the unit and in-memory suites must kill."""

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = ROOT / "tests" / "equivalent_mutants.txt"
MUTMUT = Path(sys.executable).parent / "mutmut"

# mutmut's exit codes of a mutant's test run (mutmut/stats.py).
KILLED = {1, 3}
SURVIVED = {0}
TIMEOUT = {36, 24, -24, 152, 255, -9}
"""-9 too: SIGKILL comes from the same CPU limit (RLIMIT_CPU's hard limit, one second past
the SIGXCPU one) or from the kernel's OOM killer, when a mutant loops while it allocates
(``ttl /= 2`` in ``Tiers.build``). mutmut calls it a segfault; on a busy machine that mutant
gets the SIGKILL instead of SIGXCPU."""


def statuses() -> dict[str, int | None]:
    """Mutant name -> the exit code of the test run against it (``None``: not run)."""
    found: dict[str, int | None] = {}
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        found.update(json.loads(meta.read_text())["exit_code_by_key"])
    return found


def mutated_lines(name: str) -> list[str]:
    """The lines a mutant adds (or, for a deletion, removes), as ``mutmut show`` prints them."""
    shown = subprocess.run(  # noqa: S603 - our own mutmut, a name mutmut itself gave
        [str(MUTMUT), "show", name], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.splitlines()
    diff = [line for line in shown if line[:1] in "+-" and line[:3] not in {"+++", "---"}]
    added = [line[1:].strip() for line in diff if line.startswith("+")]
    return added or [f"(deleted) {line[1:].strip()}" for line in diff]


def equivalents() -> dict[str, str]:
    """Name -> mutated line, from the list's blocks of name, ``+ line`` and reason."""
    listed: dict[str, str] = {}
    for block in EQUIVALENTS.read_text().split("\n\n"):
        lines = [line for line in block.splitlines() if not line.startswith("#")]
        if not lines:
            continue
        name, line, *why = lines
        if not line.startswith("+ ") or not why:
            sys.exit(f"{EQUIVALENTS.name}: {name}: expected '+ <mutated line>' then the reason")
        listed[name] = line[2:].strip()
    return listed


def table(found: dict[str, int | None], equivalent: set[str]) -> None:
    """Print mutants, killed, equivalent and surviving ones per module."""
    counts: Counter[tuple[str, str]] = Counter()
    for name, code in found.items():
        module = name.split(".x", 1)[0]
        if code in KILLED | TIMEOUT:
            kind = "killed"
        elif code in SURVIVED:
            kind = "equivalent" if name in equivalent else "survived"
        else:
            kind = "other"
        counts[module, kind] += 1
        counts[module, "all"] += 1
    print(f"{'module':<36} {'mutants':>7} {'killed':>7} {'equiv.':>7} {'survived':>8}")
    for module in sorted({m for m, _ in counts}):
        row = [counts[module, k] for k in ("all", "killed", "equivalent", "survived")]
        print(f"{module:<36} {row[0]:>7} {row[1]:>7} {row[2]:>7} {row[3]:>8}")


def stale_entries(listed: dict[str, str], found: dict[str, int | None]) -> list[str]:
    """Listed mutants that do not survive, or whose mutated line is not the listed one."""
    stale = []
    for name, line in sorted(listed.items()):
        if found.get(name, -1) not in SURVIVED:
            stale.append(f"  {name}: listed, but {'killed' if name in found else 'gone'}")
        elif line not in (now := mutated_lines(name)):
            stale.append(f"  {name}: the list says {line!r}, the mutant now has {now}")
    return stale


def main() -> int:
    """Print the table and the score; return 1 when the floor or the list is not met."""
    found = statuses()
    if not found:
        print("no mutants found: run 'mutmut run' first", file=sys.stderr)
        return 1
    listed = equivalents()
    survivors = {n for n, code in found.items() if code in SURVIVED}
    equivalent = set(listed) & survivors
    table(found, equivalent)

    killed = sum(1 for code in found.values() if code in KILLED | TIMEOUT)
    timeouts = sum(1 for code in found.values() if code in TIMEOUT)
    counted = len(found) - len(equivalent)
    score = 100.0 * killed / counted if counted else 100.0
    print(
        f"\nmutation score: {score:.1f} % ({killed} of {counted} non-equivalent mutants killed, "
        f"{timeouts} of them by a timeout; {len(equivalent)} more listed as equivalent); "
        f"floor {FLOOR:.1f} %"
    )
    for name in sorted(survivors - equivalent):
        print(f"\nsurvived, and not in {EQUIVALENTS.relative_to(ROOT)}: {name}")
        print("  " + "\n  ".join(mutated_lines(name)))
    stale = stale_entries(listed, found)
    if stale:
        print(f"\n{EQUIVALENTS.relative_to(ROOT)} is out of date:\n" + "\n".join(stale))
    other = sorted(n for n, code in found.items() if code not in KILLED | SURVIVED | TIMEOUT)
    if other:
        print(f"\nnot run, or no clear result (segfault, suspicious): {other}")
    failed = score < FLOOR or bool(stale) or bool(other)
    print("\nFAILED" if failed else "\nok", "(scripts/mutation)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
