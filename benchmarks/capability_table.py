"""Rewrite the capability table in docs/troubleshoot.md from the rules (toolkit.capability.capability_markdown).

.venv/bin/python benchmarks/capability_table.py          # after a rule changes; tests/train/test_capability.py
                                                         # fails while the page and the rules differ
"""

from __future__ import annotations

import re
from pathlib import Path

from toolkit.capability import capability_markdown

PAGE = Path(__file__).parents[1] / "docs" / "troubleshoot.md"


def main() -> None:
    text = PAGE.read_text()
    block = re.compile(r"(<!-- capability:begin -->\n).*?(<!-- capability:end -->)", re.S)
    PAGE.write_text(block.sub(lambda m: m.group(1) + capability_markdown().rstrip("\n") + "\n" + m.group(2), text))
    print("capability rules:", capability_markdown().count("\n| the "))


if __name__ == "__main__":
    main()
