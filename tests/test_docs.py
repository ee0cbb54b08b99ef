"""The documentation: a short README, a site that builds without a warning, research notes kept
apart, one version everywhere, and no words about how the work was organised."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sae_lens_bae

ROOT = Path(__file__).resolve().parents[1]
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
"""What a user reads: the README and the site's pages (the research notes are records)."""
PROSE = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "Makefile",
    *sorted((ROOT / "docs").rglob("*.md")),
]


def test_the_readme_is_short_and_cites_the_paper():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "arxiv.org/abs/2509.20997" in readme and "@article" in readme


def _tracked_text_files() -> list[Path]:
    """The repository's tracked files (every file under ROOT where git is missing), text only."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
        names = listed.stdout.split() if listed.returncode == 0 else []
    except OSError:
        names = []
    paths = [ROOT / n for n in names] or [p for p in ROOT.rglob("*") if ".venv" not in p.parts]
    return [p for p in paths if p.is_file() and p.suffix not in {".png", ".gguf", ".ipynb"}]


def test_no_tracked_file_has_session_words():
    """pytest's fixture scope (scope="session") is the one use of the word allowed."""
    offending = []
    for path in _tracked_text_files():
        text = path.read_text(errors="ignore").replace('scope="session"', "")
        if re.search(r"\bsessions?\b", text, flags=re.IGNORECASE):
            offending.append(str(path.relative_to(ROOT)))
    assert not offending


RESEARCH = ROOT / "docs" / "research"
STUDIES = sorted(p for p in RESEARCH.glob("*.md") if p.name != "index.md")
"""One note per study; ``index.md`` lists them."""


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_every_research_note_opens_with_its_conclusions(path):
    """A note per study: its title, at most 30 lines of current conclusions, then the record."""
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# ") and lines[2] == "## Current conclusions"
    following = next(i for i, line in enumerate(lines[3:], 3) if line.startswith("## "))
    assert following - 3 <= 30 and lines[following].startswith("## The record")


def test_one_version_everywhere():
    project = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    changelog = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert project and changelog
    assert sae_lens_bae.__version__ == project.group(1) == changelog.group(1)


def test_the_research_index_is_the_one_research_page_in_the_navigation():
    """Every user page and the research index are in the navigation; the studies are reached
    from the index, which links every committed one (a study is added to it with its record)."""
    config = (ROOT / "mkdocs.yml").read_text()
    nav = config.split("nav:")[1].split("not_in_nav:")[0]
    pages = set(re.findall(r":\s*(\S+\.md)", nav))
    user_pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == user_pages | {"research/index.md"}
    index = (RESEARCH / "index.md").read_text()
    linked = set(re.findall(r"\]\(([^)#]+\.md)", index))
    tracked = {p.name for p in _tracked_text_files() if p.parent == RESEARCH} - {"index.md"}
    assert tracked <= linked <= {p.name for p in STUDIES}, "docs/research/index.md: a study"


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    """``mkdocs build --strict``: every link, anchor and API docstring resolves."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # material's notice of its successor
    )
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    assert result.returncode == 0 and not warnings, "\n".join(warnings) or result.stderr[-2000:]
    assert (tmp_path / "cli" / "index.html").read_text().count("bae entropy") > 0


@pytest.mark.slow
def test_the_readme_example_runs(tmp_path, monkeypatch):
    """The README's Python example, on a small text and one epoch instead of the user's texts
    and ten."""
    from sae_lens_bae.data import default_corpus

    readme = (ROOT / "README.md").read_text()
    code = readme.split("## In Python")[1].split("```python")[1].split("```")[0]
    (tmp_path / "my_texts").mkdir()
    lines = default_corpus().read_text().splitlines()[:40]
    (tmp_path / "my_texts" / "texts.txt").write_text("\n".join(lines) + "\n")
    assert "epochs=10" in code
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(code.replace("epochs=10", "epochs=1"), "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["logits"].shape[:2] == (8, 128)


def _documented_commands() -> list[tuple[str, list[str]]]:
    """Every ``bae ...`` command in the bash blocks of the README and the user docs (research
    notes keep the commands of their day), continuations joined, loop variables filled in, and
    every ``bae ...`` code span in their prose."""
    import shlex

    found = []
    for path in USER_DOCS:
        text = path.read_text()
        blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
        for block in blocks:
            text = block.replace("\\\n", " ").replace("$layer", "15")
            for line in text.splitlines():
                for part in re.split(r";|&&|\bdo\b", line):
                    words = shlex.split(part.split("#")[0])
                    if words[:1] == ["bae"]:
                        found.append((path.name, words[1:]))
        if path.name != "contributing.md":  # its `bae bench foo` is a command yet to be written
            prose = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
            for span in re.findall(r"`(bae [^`]+)`", prose):
                found.append((path.name, shlex.split(span)[1:]))
    return found


@pytest.mark.parametrize(("doc", "args"), _documented_commands())
def test_every_documented_command_names_options_that_exist(doc, args):
    from typer.testing import CliRunner

    from sae_lens_bae.cli.app import app

    result = CliRunner().invoke(app, [*args, "--help"])
    assert result.exit_code == 0, f"{doc}: bae {' '.join(args)}\n{result.output}"


@functools.cache
def _app_that_only_builds_configs() -> Any:
    """The ``bae`` app with every run taken out: a command builds its config and stops."""
    import importlib

    from sae_lens_bae.cli.options import config_class

    app = importlib.import_module("sae_lens_bae.cli.app")  # the module; the package exports the app

    def stubbed(run: Any) -> Any:
        def stub(cfg: Any, progress: bool = True) -> None:  # noqa: ARG001
            return None

        stub.__annotations__ = {"cfg": config_class(run), "progress": bool}
        return stub

    return app.build_app(stubbed)


@pytest.mark.parametrize(("doc", "args"), _documented_commands())
def test_every_documented_command_builds_its_config(doc, args, monkeypatch):
    """Each documented command's values pass its config's checks (a position past
    ``--context-size``, a rate out of range), without loading a model. A path the example names
    and this checkout lacks, or a command named in prose without its required options, passes."""
    from typer.testing import CliRunner

    from sae_lens_bae.cli import options

    def refuse(error: BaseException) -> None:
        raise error

    monkeypatch.setattr(options, "fail", refuse)
    result = CliRunner().invoke(_app_that_only_builds_configs(), args)
    command = f"{doc}: bae {' '.join(args)}"
    if result.exit_code == 0 or isinstance(result.exception, FileNotFoundError):
        return
    if result.exit_code == 2 and ("Missing option" in result.output or not args[1:]):
        return  # named in prose without its required options, or a group named alone
    pytest.fail(f"{command}\n{result.output}\n{result.exception!r}")


def test_the_documented_commands_are_found():
    commands = _documented_commands()
    assert len(commands) > 20
    assert any(args[:1] == ["compare"] and "--probe-datasets" in args for _, args in commands)


def _python_names() -> list[tuple[str, str]]:
    """Every name the README and the user docs show from the package: what their Python blocks
    import (``from X import a, b``, ``import X``) and every ``sae_lens_bae.a.b`` code span."""
    import ast

    found = []
    for path in USER_DOCS:
        text = path.read_text()
        for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
            for node in ast.walk(ast.parse(block)):
                if isinstance(node, ast.ImportFrom) and node.module:
                    found += [(path.name, f"{node.module}.{a.name}") for a in node.names]
                elif isinstance(node, ast.Import):
                    found += [(path.name, a.name) for a in node.names]
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for name in re.findall(r"`(sae_lens_bae(?:\.[A-Za-z_][A-Za-z0-9_]*)+)", prose):
            found.append((path.name, name))
    return sorted(set(found))


def _resolve(name: str) -> object:
    """The object a dotted name names: its longest importable module, then attributes."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(name)


def test_the_documented_python_names_are_found():
    names = [name for _, name in _python_names()]
    assert len(names) > 20 and "sae_lens_bae.estimate_entropies" in names


@pytest.mark.parametrize(("doc", "name"), _python_names())
def test_every_documented_python_name_imports(doc, name):
    try:
        _resolve(name)
    except (ImportError, AttributeError) as error:
        pytest.fail(f"{doc}: {name} does not import ({error})")


@pytest.mark.parametrize("path", [*USER_DOCS, RESEARCH / "index.md"], ids=lambda p: p.name)
def test_every_relative_link_resolves(path):
    """Links to files of the repository (mkdocs checks the site's own; the README is not in it)."""
    prose = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    targets = re.findall(r"\]\(([^)\s]+)\)", prose)
    missing = [
        target
        for target in targets
        if not re.match(r"[a-z]+:|#", target) and not (path.parent / target.split("#")[0]).exists()
    ]
    assert not missing, f"{path.name}: {missing}"


USES = [
    "entropy of a set of states",
    "entropy traces of an LLM",
    "features, compared with SAEs",
    "SynthSAEBench",
    "steering",
    "compression, more-bit decoding",
    "training in SAELens' runners",
    "any Hugging Face model",
]
"""The README's status table: one row per use."""


def test_the_readme_status_table_names_a_record_for_every_use():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## What works today")[1].split("\n\n")[1]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert [row[0].lstrip("| ") for row in rows] == USES
    for row in rows:
        assert len(row) == 4 and "`" in row[2], f"{row[0]}: no command or call"
        records = re.findall(r"\]\((docs/research/[^)]+\.md)\)", row[3])
        assert records and all((ROOT / r).exists() for r in records), f"{row[0]}: no record"
