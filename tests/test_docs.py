"""The README and the manual in docs/: the generated hook table matches the code, the README stays a
front page whose links land on pages of the manual, and every page is in the manual's nav."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from raymodel import contract

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def test_the_hook_table_is_the_one_the_backends_declare():
    text = (DOCS / "backends.md").read_text()
    table = re.search(r"<!-- hook-table -->\n(.*?)\n<!-- /hook-table -->", text, re.S)
    assert table, "docs/backends.md lost its hook table markers"
    assert table.group(1) == contract.hook_table(), (
        "docs/backends.md's hook table is stale; paste `raymodel.contract.hook_table()` between the markers"
    )


def test_the_readme_is_a_front_page_that_links_into_the_manual():
    text = README.read_text()
    assert len(text.splitlines()) < 200
    assert "make demo" in text and "make test" in text
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 12, links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, f"README links to pages that do not exist: {missing}"


def test_every_page_of_the_manual_is_in_its_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))

    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for value in node.values():
                yield from pages(value)
        elif isinstance(node, list):
            for value in node:
                yield from pages(value)

    in_nav = set(pages(config["nav"]))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert on_disk == in_nav, (
        f"pages not in mkdocs.yml's nav: {sorted(on_disk - in_nav)}; "
        f"nav entries without a page: {sorted(in_nav - on_disk)}"
    )


def test_the_settings_bounds_table_is_the_code_s():
    from raymodel._internal.settings import LIMITS

    text = (DOCS / "reference" / "settings.md").read_text()
    documented = {
        name: float(bound.replace(",", ""))
        for name, bound in re.findall(r"^\| `(\w+)` \| [^|]+ \| ([\d,.]+) \|", text, re.M)
    }
    assert {k: documented.get(k) for k in LIMITS} == {k: float(v) for k, v in LIMITS.items()}, (
        "docs/reference/settings.md's bounds table differs from raymodel._internal.settings.LIMITS"
    )
