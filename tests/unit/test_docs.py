"""The documentation's contract with the code: every example is a file that runs, and the
README, the package index's page, links only to where it can.

The examples themselves run in tests/component/test_docs_examples.py and
tests/integration/test_docs_examples.py; ``mkdocs build --strict`` (scripts/test's lint)
fails on a broken link, anchor or include inside the site.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples" / "docs"
# Where the site is published: mkdocs.yml's site_url, the one place that says it.
_SITE_URL = re.search(r"^site_url: (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
assert _SITE_URL, "mkdocs.yml names no site_url"
SITE = _SITE_URL[1]
INCLUDE = re.compile(r'^--8<-- "(?P<path>[^":]+)(?::(?P<section>[\w-]+))?"$')
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
PAGES = sorted(DOCS.rglob("*.md"))


def fences(text: str, lang: str) -> list[str]:
    return [m["body"] for m in FENCE.finditer(text) if m["lang"] == lang]


def included() -> set[str]:
    """Every file a page includes (``--8<-- "path"`` or ``"path:section"``)."""
    paths = set()
    for page in PAGES:
        for line in page.read_text().splitlines():
            if found := INCLUDE.match(line.strip()):
                paths.add(found["path"])
    return paths


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_python_on_a_page_is_an_included_file(page: Path) -> None:
    """A ```python block holds one include line: the code a page shows is code the tests run."""
    for body in fences(page.read_text(), "python"):
        lines = body.strip().splitlines()
        assert len(lines) == 1, f"{page}: inline Python; move it to examples/docs/ and include it"
        found = INCLUDE.match(lines[0])
        assert found, f"{page}: {lines[0]!r} is not an include of examples/docs/"
        assert found["path"].startswith("examples/docs/"), found["path"]


def test_every_included_section_exists() -> None:
    for page in PAGES:
        for line in page.read_text().splitlines():
            found = INCLUDE.match(line.strip())
            if not found or not found["section"]:
                continue
            text = (ROOT / found["path"]).read_text()
            assert f"--8<-- [start:{found['section']}]" in text, (page, line)
            assert f"--8<-- [end:{found['section']}]" in text, (page, line)


def test_every_example_is_on_a_page() -> None:
    """An example no page shows is dead weight (tests, stand-ins and packages excepted)."""
    shown = included()
    for example in sorted([*EXAMPLES.glob("*.py"), *EXAMPLES.glob("*.toml")]):
        if example.name in {"__init__.py", "ruff.toml"}:
            continue
        if example.name.startswith("test_") and not any(
            path.endswith(example.name) for path in shown
        ):
            pytest.fail(f"{example.name}: a test no page shows")
        assert f"examples/docs/{example.name}" in shown, f"{example.name}: no page includes it"


def _docstring_free(source: str) -> str:
    """An example's code as the README shows it: without its module docstring."""
    return source.split('"""', 2)[2].lstrip("\n") if source.startswith('"""') else source


def test_the_readme_quickstart_is_the_example_verbatim() -> None:
    """The package index cannot include files: the README's copy is checked instead."""
    blocks = fences((ROOT / "README.md").read_text(), "python")
    assert blocks == [_docstring_free((EXAMPLES / "service.py").read_text())]


def site_page(url: str) -> Path | None:
    """The docs/ source of a site URL (directory URLs: ``how-to/cli/`` is ``how-to/cli.md``)."""
    path = url.removeprefix(SITE).split("#", 1)[0].strip("/")
    for candidate in (DOCS / f"{path}.md", DOCS / path / "index.md"):
        if candidate.is_file():
            return candidate
    return None


def anchors(page: Path) -> set[str]:
    """The heading ids mkdocs's toc gives a page (the README's, for the home page)."""
    text = page.read_text()
    if included_from := INCLUDE.match(text.strip()):
        text = (ROOT / included_from["path"]).read_text()
    text = FENCE.sub("", text)
    ids = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\s-]", "", heading.lower()).strip()
        ids.add(re.sub(r"[\s]+", "-", slug))
    return ids


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"])
def test_the_front_pages_link_absolutely_and_into_pages_that_exist(name: str) -> None:
    """On the package index a relative link is dead; one into the site names a real page."""
    text = (ROOT / name).read_text()
    for target in LINK.findall(text):
        assert target.startswith("https://"), f"{name}: {target} is not absolute"
        if not target.startswith(SITE):
            continue
        page = site_page(target)
        assert page is not None, f"{name}: {target} names no page of docs/"
        if "#" in target:
            assert target.split("#", 1)[1] in anchors(page), f"{name}: no anchor in {target}"


def test_the_readme_is_a_front_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_has_every_option_and_shows_placeholders_as_written() -> None:
    """Generated from the typer app: options included (mkdocs-click listed none), <queue> kept."""
    text = _hooks().cli_reference()
    for option in ["--dry-run", "--from-export", "--factory", "--json", "-y", "--version"]:
        assert f"`{option}" in text, option
    assert "&lt;queue>.migrating" in text


def test_the_worker_config_tables_show_durations_as_a_file_writes_them() -> None:
    from faststream_retry import worker_config_schema  # noqa: PLC0415

    text = _hooks().render(worker_config_schema())
    assert '| `max_delay` | duration | `"1 d"` |' in text
