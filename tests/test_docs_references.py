"""The repository stands on its own: the documents its files cite are in it.

Every page of docs/ that a file names exists, and no file cites a document that lives outside the
repository (the rules are stated in docs/rules.md, which the code's comments cite by number).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES: Final = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".html", ".js"}
#: Documents that are not part of the repository, by the names they go by.
OUTSIDE: Final = re.compile(r"DESIGN\.md|DESIGN rule|ENGINEERING-NOTES|\.\./shared/")
DOC: Final = re.compile(r"docs/([\w-]+\.md)")


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / name for name in listed if Path(name).suffix in TEXT_SUFFIXES]


def test_no_file_cites_a_document_outside_the_repository() -> None:
    cited = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in tracked_text_files()
        if path.name != Path(__file__).name
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert cited == []


def test_every_cited_page_of_docs_exists() -> None:
    missing = sorted(
        {
            f"{path.relative_to(ROOT)} cites docs/{name}"
            for path in tracked_text_files()
            for name in DOC.findall(path.read_text(errors="replace"))
            if not (ROOT / "docs" / name).exists()
        }
    )
    assert missing == []


def test_the_rules_are_numbered_in_the_repository() -> None:
    rules = (ROOT / "docs" / "rules.md").read_text()
    numbers = [int(n) for n in re.findall(r"^(\d+)\. \*\*", rules, flags=re.MULTILINE)]
    assert numbers == list(range(1, 12))
