"""The tutorial notebooks run top to bottom: a cell that raises fails the suite.

Each tutorial is a jupytext percent-format ``.py`` paired with an outputs-stripped ``.ipynb``
(what Jupyter and GitHub open). The test checks the pair agrees cell by cell, then executes the
notebook in a fresh ``python3`` kernel
(ipykernel's own: this interpreter) with nbclient, writing its runs under a temp dir.
"""

from __future__ import annotations

from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # the tutorials run as notebooks in a kernel of their own

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("[0-9][0-9]_*.py"))


def _sources(notebook: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source.strip()) for cell in notebook.cells]


def test_there_is_a_notebook_per_application():
    assert [p.stem for p in NOTEBOOKS] == [
        "01_train_bae",
        "02_entropy",
        "03_features_comsem",
        "04_steer_compress",
    ]


@pytest.mark.parametrize("script", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_ipynb_is_the_paired_script_without_outputs(script: Path):
    paired = script.with_suffix(".ipynb")
    assert paired.is_file(), f"{paired.name} missing: run `make notebooks`"
    stored = nbformat.read(paired, as_version=4)
    assert _sources(stored) == _sources(jupytext.read(script)), (
        f"{paired.name} differs from {script.name}: run `make notebooks`"
    )
    for cell in stored.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "outputs not stripped"


@pytest.mark.parametrize("script", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(script: Path, tmp_path: Path, monkeypatch):
    notebook = jupytext.read(script)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    monkeypatch.setenv("TUTORIAL_OUT", str(tmp_path / "runs"))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend: PNG outputs
    client = NotebookClient(
        notebook,
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError naming the failing cell
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.output_type == "error"
    ]
    assert errors == []
    assert all(c.execution_count for c in notebook.cells if c.cell_type == "code")
    pictures = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    ]
    assert pictures, "every tutorial draws at least one figure"
