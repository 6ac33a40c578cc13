"""The README's generated parts match the code."""

from __future__ import annotations

import re
from pathlib import Path

from raymodel import contract

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_hook_table_is_the_one_the_backends_declare():
    text = README.read_text()
    table = re.search(r"<!-- hook-table -->\n(.*?)\n<!-- /hook-table -->", text, re.S)
    assert table, "the README lost its hook table markers"
    assert table.group(1) == contract.hook_table(), (
        "README's hook table is stale; paste `raymodel.backends.contract.hook_table()` between the markers"
    )
