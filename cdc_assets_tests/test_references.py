"""Every place the code, the tests and the documents name exists: a module path (`cdc_assets/lake/delta.py`,
`stages/current/rows.py`), a dotted module (`cdc_assets.stages.history.as_of`, `lake.delta.fenced`), a document
(`docs/reliability.md`, a Markdown link), and the name a mention gives inside a module (`rules.merged_with_outcomes`);
so a comment never points at a place that moved or is gone (issue 43). No file cites a document outside the
repository. Read from the files alone, no server needed."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from cdc_assets.core.failpoints import FAILPOINTS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cdc_assets", "spark_resources", "benchmarks", "cdc_assets_tests")
# the folders of cdc_assets a mention may start with (`lake/delta.py`, `stages.current.rules`)
SUBPACKAGES = tuple(sorted(p.name for p in (ROOT / "cdc_assets").iterdir() if (p / "__init__.py").exists()))
TOP = PACKAGES + ("docs",)
_NAME = r"[A-Za-z_]\w*"
# a path: cdc_assets/lake/delta.py, docs/architecture.md, lake/delta.py, stages/current/rules.merged_with_outcomes
_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP + SUBPACKAGES)})(?:/{_NAME})+)(\.(?:py|md)\b|\.{_NAME}|/?)")
# a dotted module: cdc_assets.stages.history.as_of, spark_resources.engine.choose_transforms, lake.delta.fenced
_DOTTED = re.compile(rf"(?<![\w./-])((?:{'|'.join(PACKAGES + SUBPACKAGES)})(?:\.{_NAME})+)")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# a file of another kind than a module's, named by its file name (`defs.yaml`, apt's `sources.list`)
DATA_FILE_SUFFIXES = ("yaml", "yml", "toml", "json", "list", "sql", "txt")
# what cites a document outside the repository
_OUTSIDE = re.compile(r"\.\./shared/|CONTRACT\s*§")


def _files() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for package in PACKAGES:
        found += sorted(
            p for p in (ROOT / package).rglob("*") if p.suffix in (".py", ".md") and "__pycache__" not in p.parts
        )
    return found


def _prose(path: Path) -> str:
    """What a file says in words: a document whole, a module's comments and strings (its code names variables such
    as `source` or `lake` that are not the folders)."""
    text = path.read_text()
    if path.suffix == ".md":
        return text
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return "\n".join(t.string for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING))


def _module_file(parts: list[str]) -> tuple[Path | None, list[str]]:
    """The longest prefix of `parts` that is a module or package of the repository (a bare folder of cdc_assets
    counts from cdc_assets), and the names after it."""
    bases = [ROOT] if parts[0] in TOP else [ROOT / "cdc_assets"]
    for end in range(len(parts), 0, -1):
        for base in bases:
            candidate = base.joinpath(*parts[:end])
            if candidate.with_suffix(".py").is_file():
                return candidate.with_suffix(".py"), parts[end:]
            if candidate.is_dir():
                return candidate, parts[end:]
    return None, parts


def _names(module: Path) -> str:
    """The text a name after a module must appear in: the module's own, or a package's modules' (`defs.jobs`)."""
    if module.is_dir():
        return "\n".join(p.read_text() for p in module.rglob("*.py") if "__pycache__" not in p.parts)
    return module.read_text()


def _broken(parts: list[str], names: str | None = None) -> str | None:
    module, rest = _module_file(parts)
    if module is None:
        return "no such module"
    if rest:
        # the first name after the module is one it defines or mentions (a function, class, constant, a submodule)
        if not re.search(rf"\b{re.escape(rest[0])}\b", names if names is not None else _names(module)):
            return f"{module.relative_to(ROOT)} has no {rest[0]}"
    return None


def test_every_module_and_document_named_exists() -> None:
    broken = []
    for path in _files():
        prose = _prose(path)
        where = path.relative_to(ROOT)
        for match in _PATH.finditer(prose):
            stem, tail = match.group(1), match.group(2)
            parts = stem.split("/")
            if tail in (".py", ".md"):
                target = (ROOT if parts[0] in TOP else ROOT / "cdc_assets").joinpath(*parts[:-1], parts[-1] + tail)
                if not target.is_file():
                    broken.append(f"{where}: {stem}{tail} does not exist")
                continue
            if parts[0] == "docs":
                continue
            if tail[1:] in DATA_FILE_SUFFIXES:  # a data file of the repository, by its path
                target = (ROOT if parts[0] in TOP else ROOT / "cdc_assets").joinpath(*parts[:-1], parts[-1] + tail)
                if not target.is_file():
                    broken.append(f"{where}: {stem}{tail} does not exist")
                continue
            extra = [tail[1:]] if tail.startswith(".") else []
            problem = _broken(parts + extra)
            # a path without .py may name a folder or file of the lakehouse (`current/<schema>/<table>`): only a
            # mention that reaches a module of the repository is checked for the name after it
            if problem and (problem != "no such module" or tail == ".py"):
                broken.append(f"{where}: {stem}{tail}: {problem}")
        for match in _DOTTED.finditer(prose):
            if match.group(1) in FAILPOINTS:
                continue  # a failpoint's name (`capture.upload_part`), not a module
            if path.suffix == ".md" and match.group(1).endswith(".md"):  # a page beside this one, as docs pages link
                if not (path.parent / match.group(1)).is_file():
                    broken.append(f"{where}: {match.group(1)} does not exist beside it")
                continue
            parts = match.group(1).split(".")
            if len(parts) == 2 and parts[1] in DATA_FILE_SUFFIXES:
                continue  # a file's name (`defs.yaml`), not a module
            module, rest = _module_file(parts)
            if module is None and parts[0] in SUBPACKAGES:
                continue  # `source.table`, `lake.open(...)`: words, not a module
            problem = _broken(parts)
            if problem:
                broken.append(f"{where}: {match.group(1)}: {problem}")
        if path.suffix == ".md":
            for match in _LINK.finditer(prose):
                link = match.group(1)
                if "://" in link or link.startswith("mailto:"):
                    continue
                target = (path.parent / link).resolve()
                if not target.is_relative_to(ROOT) or not target.exists():
                    broken.append(f"{where}: the link {link} leads to nothing in the repository")
    assert broken == [], "\n".join(broken)


def test_no_file_cites_a_document_outside_the_repository() -> None:
    cited = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in _files()
        if p != Path(__file__)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if _OUTSIDE.search(line)
    ]
    assert cited == [], "\n".join(cited)


_ANCHOR_LINK = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")


def _anchors(document: Path) -> set[str]:
    """The anchors GitHub gives a document's headings: the text in lower case, without what is not a letter, digit,
    space, `-` or `_`, spaces as `-`; a repeated one gets `-1`, `-2`…. Headings inside code blocks are not headings."""
    found: set[str] = set()
    fenced = False
    for line in document.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} (.*)", line)
        if heading:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1).strip())
            anchor = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
            n, unique = 0, anchor
            while unique in found:
                n += 1
                unique = f"{anchor}-{n}"
            found.add(unique)
    return found


def test_every_link_to_a_section_names_a_heading_there() -> None:
    """A link to a section (`docs/operating.md#continuous-mode`, `#repair`) leads to a heading of that document, so
    a section moved to another page (issue 44: the README's reference went to docs/) leaves no link behind."""
    broken = []
    for path in _files():
        if path.suffix != ".md":
            continue
        for match in _ANCHOR_LINK.finditer(path.read_text()):
            link, anchor = match.groups()
            if "://" in link:
                continue
            target = (path.parent / link).resolve() if link else path
            if target.suffix == ".md" and target.is_file() and anchor not in _anchors(target):
                broken.append(f"{path.relative_to(ROOT)}: {link}#{anchor} names no heading of {target.relative_to(ROOT)}")
    assert broken == [], "\n".join(broken)
