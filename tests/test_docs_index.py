"""The documentation hangs together: every page under docs/ is reachable from the index,
docs/README.md, by following links, and every relative link in README.md and docs/ leads to a
file that exists (and, where it names a heading, to that heading).

Links are read as GitHub renders them: ``[text](target)`` outside code, a folder standing for
its README.md; a heading's anchor is
its text in lower case, punctuation dropped, spaces as ``-`` (``## Sigma: how it is
estimated`` is ``#sigma-how-it-is-estimated``), with ``-1``, ``-2`` ... for repeats.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
PAGES = sorted(DOCS.rglob("*.md"))
DOCUMENTS = [ROOT / "README.md", *PAGES]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # https:, mailto:, ...


@dataclass(frozen=True)
class Link:
    """A relative link: the page it is on and where, the file it leads to, its anchor."""

    where: str  # "docs/service.md:12"
    target: Path  # resolved, without the anchor
    anchor: str  # "" when the link names no heading

    @property
    def exists(self) -> bool:
        return self.target.exists()


def _name(path: Path) -> str:
    """``path`` from the repository root where it is inside it."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def _prose_lines(path: Path) -> Iterator[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered from 1, code spans blanked."""
    fenced = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def links(path: Path) -> list[Link]:
    """The relative links of ``path`` (to a file, a heading of it, or a heading of the page)."""
    found = []
    for number, line in _prose_lines(path):
        for match in LINK.finditer(line):
            target = match.group(1)
            if EXTERNAL.match(target):
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / unquote(file)).resolve() if file else path
            if resolved.is_dir() and (resolved / "README.md").is_file():
                resolved = resolved / "README.md"  # what GitHub shows for a folder
            where = f"{_name(path)}:{number}"
            found.append(Link(where, resolved, unquote(anchor)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: links reduced to their text, lower case,
    punctuation dropped, each space a ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of ``path``'s headings (repeats numbered) and of its ``<a id|name>`` tags."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = None if fenced else HEADING.match(line)
        if heading is not None:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found |= set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line))
    return found


def reachable_from(index: Path) -> set[Path]:
    """The pages under docs/ that following links from ``index`` leads to, ``index`` too."""
    reached, todo = {index.resolve()}, [index.resolve()]
    while todo:
        page = todo.pop()
        for link in links(page):
            target = link.target
            inside = target.is_relative_to(DOCS.resolve())
            if inside and target.suffix == ".md" and target.is_file() and target not in reached:
                reached.add(target)
                todo.append(target)
    return reached


def test_the_docs_have_an_index_and_pages() -> None:
    assert INDEX.is_file()
    assert len(PAGES) > 10


def test_every_page_is_reachable_from_the_index() -> None:
    reached = reachable_from(INDEX)
    missing = [page.relative_to(ROOT).as_posix() for page in PAGES if page.resolve() not in reached]
    assert not missing, f"pages that no link from docs/README.md leads to: {missing}"


def test_the_front_page_leads_to_the_index() -> None:
    assert INDEX.resolve() in {link.target for link in links(ROOT / "README.md")}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_to_a_file_that_exists(document: Path) -> None:
    broken = [
        f"{link.where}: {link.target}" for link in links(document) if not link.target.exists()
    ]
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_to_a_heading_finds_it(document: Path) -> None:
    wrong = [
        f"{link.where}: #{link.anchor} is no heading of {_name(link.target)}"
        for link in links(document)
        if link.anchor and link.target.suffix == ".md" and link.target.is_file()
        if link.anchor not in anchors(link.target)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_link_reader_reads_links_as_github_renders_them(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title: the `smso-serve` reference\n"
        "[a](other.md) and [b](other.md#sigma-how-it-is-estimated) and [c](https://x.org/y.md)\n"
        "`[not](a-link.md)` and [d](#title-the-smso-serve-reference)\n"
        "```\n[in code](code.md)\n```\n"
        "## Title: the `smso-serve` reference\n"
    )
    found = [(link.target.name, link.anchor) for link in links(page)]
    assert found == [
        ("other.md", ""),
        ("other.md", "sigma-how-it-is-estimated"),
        ("page.md", "title-the-smso-serve-reference"),
    ]
    assert anchors(page) == {"title-the-smso-serve-reference", "title-the-smso-serve-reference-1"}
    assert slug("Sigma: how it is estimated") == "sigma-how-it-is-estimated"
    assert (
        slug("What runs on 2 CPU cores: Fashion-MNIST") == "what-runs-on-2-cpu-cores-fashion-mnist"
    )
