"""The documentation: a short README, a site that builds without a warning, research notes kept
apart, one version everywhere, and no words about how the work was organised."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sae_lens_bae

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.parametrize(
    "path", sorted((ROOT / "docs" / "research").glob("*.md")), ids=lambda p: p.name
)
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


def test_research_notes_stay_out_of_the_navigation():
    config = (ROOT / "mkdocs.yml").read_text()
    nav = config.split("nav:")[1].split("not_in_nav:")[0]
    assert "research/" not in nav
    pages = set(re.findall(r":\s*(\S+\.md)", nav))
    assert pages == {p.name for p in (ROOT / "docs").glob("*.md")}  # every page in it


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
    notes keep the commands of their day), continuations joined, loop variables filled in."""
    import shlex

    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks = re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S)
        for block in blocks:
            text = block.replace("\\\n", " ").replace("$layer", "15")
            for line in text.splitlines():
                for part in re.split(r";|&&|\bdo\b", line):
                    words = shlex.split(part.split("#")[0])
                    if words[:1] == ["bae"]:
                        found.append((path.name, words[1:]))
    return found


@pytest.mark.parametrize(("doc", "args"), _documented_commands())
def test_every_documented_command_names_options_that_exist(doc, args):
    from typer.testing import CliRunner

    from sae_lens_bae.cli.app import app

    result = CliRunner().invoke(app, [*args, "--help"])
    assert result.exit_code == 0, f"{doc}: bae {' '.join(args)}\n{result.output}"


def test_the_documented_commands_are_found():
    commands = _documented_commands()
    assert len(commands) > 20
    assert any(args[:1] == ["compare"] and "--probe-datasets" in args for _, args in commands)
