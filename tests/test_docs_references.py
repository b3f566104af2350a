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


#: A path in the repository as comments and documents cite it (`services/executor/plan.py`).
CITED_PATH: Final = re.compile(
    r"(?<![\w./-])((?:events|policy|projections|services|cluster|fairlane|simulation|bench|tests"
    r"|deploy|docs|examples|scenarios|\.ci)/[\w./-]*\w\.(?:py|md|yaml|yml|sql|sh|js|html|json"
    r"|toml|c|conf|png))\b"
)
#: Files a reader is told to write (not ours), and the made-up paths the layout test classifies.
NOT_OURS: Final = {"deploy/compose.nodes.yaml"}
MADE_UP: Final = {"tests/test_layout.py"}


def test_every_cited_file_of_the_repository_exists() -> None:
    """After files move (the platform code to cluster/, the executor's modules to its plan and
    actuator), no comment or document still sends a reader to where a file was."""
    missing = sorted(
        f"{path.relative_to(ROOT)}:{n}: {cited}"
        for path in tracked_text_files()
        if str(path.relative_to(ROOT)) not in MADE_UP
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1)
        for cited in CITED_PATH.findall(line)
        if cited not in NOT_OURS
        and not any(mark in cited for mark in ("*", "<", "NAME"))
        and not (ROOT / cited).exists()
    )
    assert missing == []
