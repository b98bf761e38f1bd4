"""Print pip constraints that pin each runtime dependency to the floor it declares.

Run it with a Python that has faststream-retry installed (it reads the installed
metadata, so it sees exactly what pip sees). Every runtime dependency must declare a
floor (``>=``): a dependency without one could not be tested at its lowest version.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import requires


def main() -> int:
    """Write one ``name==floor`` line per runtime dependency."""
    for requirement in requires("faststream-retry") or []:
        if "extra ==" in requirement:
            continue  # optional extras float
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[[^\]]*\])?\s*\(?([^;)]*)", requirement)
        floor = re.search(r">=\s*([^,\s]+)", match[2]) if match else None
        if match is None or floor is None:
            print(f"no floor (>=) declared in {requirement!r}", file=sys.stderr)
            return 1
        print(f"{match[1]}=={floor[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
