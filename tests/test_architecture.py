"""The package's shape: imports go one way (model -> activations -> BAE -> codes -> applications ->
experiments -> CLI), no cycles, imports at module top level, every module says what it is."""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

import sae_lens_bae

ROOT = Path(sae_lens_bae.__file__).parent
PACKAGE = "sae_lens_bae"

FLOORS = {
    "sae_lens_bae.checks": 0,
    "sae_lens_bae.reports": 0,
    "sae_lens_bae.plots": 0,
    "sae_lens_bae.saes": 1,  # the architectures; the BAE's maths beside it
    "sae_lens_bae.registry": 1,
    "sae_lens_bae.outliers": 1,  # the rule for extreme states: the BAE's step and every path in
    "sae_lens_bae.kernels": 2,  # faster paths that register into the architecture's seam
    "sae_lens_bae.models": 2,
    "sae_lens_bae.data": 2,
    "sae_lens_bae.prompts": 2,
    "sae_lens_bae.activations": 3,
    "sae_lens_bae.evaluation": 3,
    "sae_lens_bae.parallel": 4,  # data-parallel training: the global batch, the DDP trainer
    "sae_lens_bae.training": 4,
    "sae_lens_bae.stacks": 4,  # stacks of BAEs, trained with the training floor's pieces
    "sae_lens_bae.entropy": 5,
    "sae_lens_bae.features": 5,
    "sae_lens_bae.compression": 5,
    "sae_lens_bae.steering": 5,
    "sae_lens_bae.comsem": 6,
    "sae_lens_bae.dashboard": 6,
    "sae_lens_bae": 7,  # the package itself: the public API, over the whole core
    "sae_lens_bae.experiments": 8,
    "sae_lens_bae.cli": 9,
    "sae_lens_bae.__main__": 9,
}
"""Floor of every part of the package: a module imports only from its own floor or below."""
CORE_TOP = FLOORS["sae_lens_bae"]


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _floor(module: str) -> int:
    part = max((p for p in FLOORS if module == p or module.startswith(p + ".")), key=len)
    return FLOORS[part]


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """(imported package module, line) of every import of this package in ``module``."""
    tree = ast.parse(path.read_text())
    found = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((submodule if submodule in MODULES else base, node.lineno))
    return [(name, line) for name, line in found if name.split(".")[0] == PACKAGE]


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def test_every_floor_names_a_part_that_exists():
    assert set(FLOORS) <= set(MODULES)
    for module in MODULES:
        _floor(module)  # every module belongs to a floor


def test_imports_go_down_the_floors_only():
    upward = [
        f"{module}:{line} imports {target}"
        for module, targets in GRAPH.items()
        for target, line in targets
        if _floor(target) > _floor(module)
    ]
    assert not upward, "\n".join(upward)


def test_the_core_never_imports_an_experiment_or_the_cli():
    core = [m for m in MODULES if _floor(m) <= CORE_TOP]
    assert "sae_lens_bae.entropy.estimate" in core and "sae_lens_bae.experiments" not in core
    bad = [
        f"{module} imports {target}"
        for module in core
        for target, _ in GRAPH[module]
        if _floor(target) > CORE_TOP
    ]
    assert not bad, bad


def _cycle() -> list[str] | None:
    """One import cycle among the package's modules, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for target, _ in GRAPH.get(module, []):
            if state.get(target) == 1:
                return stack[stack.index(target) :] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[module] = 2
        return None

    for module in MODULES:
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_import_cycles():
    assert _cycle() is None, " -> ".join(_cycle() or [])


def test_the_cycle_check_finds_a_cycle():
    GRAPH["sae_lens_bae.saes.objective"].append(("sae_lens_bae.saes.bae", 0))  # bae imports it
    try:
        cycle = _cycle()
    finally:
        GRAPH["sae_lens_bae.saes.objective"].pop()
    assert cycle is not None and cycle[0] == cycle[-1]
    assert {"sae_lens_bae.saes.objective", "sae_lens_bae.saes.bae"} <= set(cycle)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_says_what_it_is_and_imports_at_top_level(module):
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree)
    assert doc and doc.strip(), f"{path} has no module docstring"
    nested = [
        node.lineno
        for outer in ast.walk(tree)
        if isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        for node in ast.walk(outer)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]
    assert not nested, f"{path}: imports inside functions or classes at lines {nested}"


IMPORT_NAMES = {
    "sae_lens": "sae-lens",
    "transformer_lens": "transformer-lens",
    "typing_extensions": "typing-extensions",
    "simple_parsing": "simple-parsing",
    "sklearn": "scikit-learn",
}
NOT_IMPORTED = {"gguf": "read by transformers' GGUF loader (the embedded model)"}
OPTIONAL = {"triton": "ships with torch's CUDA wheels; the dev extra brings it for CPU tests"}
"""Imports guarded by ``except ImportError``, declared in an extra rather than required."""
REQUIREMENTS = metadata.requires("sae-lens-bae") or []


def test_declared_dependencies_are_exactly_the_third_party_imports():
    names = {r: re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in REQUIREMENTS}
    declared = {name for r, name in names.items() if "extra ==" not in r}
    extras = {name for r, name in names.items() if "extra ==" in r}
    imported = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {
        IMPORT_NAMES.get(name, name)
        for name in imported
        if name != PACKAGE and name not in sys.stdlib_module_names
    }
    assert set(OPTIONAL) <= third_party and set(OPTIONAL) <= extras, "optional, not in an extra"
    third_party -= set(OPTIONAL)
    assert third_party - declared == set(), "imported but not declared"
    assert declared - third_party - set(NOT_IMPORTED) == set(), "declared but never imported"


def test_configs_keep_to_their_field_budgets():
    """A knob earns its place (docs/research/consolidation.md): the BAE's training config adds
    at most 11 fields to SAELens' TrainingSAEConfig (``coefficient_width`` shows the d_in rule
    that every BAE's coefficients follow), and an entropy recipe has at most 10."""
    import dataclasses

    from sae_lens.saes.sae import TrainingSAEConfig

    from sae_lens_bae.entropy import EntropyRecipe
    from sae_lens_bae.saes.bae import BAETrainingSAEConfig

    saelens = {f.name for f in dataclasses.fields(TrainingSAEConfig)}
    own = [f.name for f in dataclasses.fields(BAETrainingSAEConfig) if f.name not in saelens]
    assert len(own) <= 11, own
    assert len(dataclasses.fields(EntropyRecipe)) <= 10


def _closure(module: str) -> set[str]:
    """The package modules ``module`` imports, following every import (those in functions too)."""
    seen, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current in seen or current not in MODULES:
            continue
        seen.add(current)
        tree = ast.parse(MODULES[current].read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                todo += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names]
    return seen


def test_the_bae_architecture_imports_no_kernel_distributed_or_stack_code():
    """What a reader opens to follow one BAE's training step: the modules the classes registered
    as "bae" import, none of them Triton, torch.distributed, the stacks, the kernels or the
    data-parallel trainer (those plug into its seams)."""
    closure = _closure("sae_lens_bae.saes.bae")
    assert "sae_lens_bae.saes.objective" in closure  # the walk follows the package's imports
    for module in closure:
        assert not module.startswith(
            ("sae_lens_bae.stacks", "sae_lens_bae.kernels", "sae_lens_bae.parallel")
        ), module
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.startswith(("triton", "torch.distributed"))], module


def test_the_training_step_is_saelens_own(monkeypatch):
    """A BAE's training step runs SAELens' ``TrainingSAE.training_forward_pass`` once, on the
    step's input (screened for extreme rows, of which it has none), and returns what it built;
    no BAE config field hides a default behind None."""
    from sae_lens.saes.sae import TrainingSAE, TrainStepInput

    from sae_lens_bae.saes.bae import BAETrainingSAE, BAETrainingSAEConfig

    saelens_step = TrainingSAE.training_forward_pass
    calls = []

    def counted(self, step_input):
        calls.append(step_input)
        calls.append(saelens_step(self, step_input))
        return calls[-1]

    monkeypatch.setattr(TrainingSAE, "training_forward_pass", counted)
    sae = BAETrainingSAE(BAETrainingSAEConfig(d_in=8, d_sae=16))
    step = TrainStepInput(
        sae_in=torch.randn(32, 8, generator=torch.Generator().manual_seed(0)),
        coefficients={k: getattr(v, "value", v) for k, v in sae.get_coefficients().items()},
        dead_neuron_mask=None,
        n_training_steps=0,
        is_logging_step=False,
    )
    output = sae.training_forward_pass(step)
    assert len(calls) == 2 and torch.equal(calls[0].sae_in, step.sae_in)
    assert (calls[0].coefficients, calls[0].n_training_steps) == (step.coefficients, 0)
    assert output.loss is calls[1].loss  # the loss is the one SAELens' step summed
    assert "= None  # type: ignore" not in MODULES["sae_lens_bae.saes.bae"].read_text()


def test_no_alias_for_an_old_name():
    """0.2.0 is the first release: nothing warns of a rename or keeps an old name alive."""
    for module, path in MODULES.items():
        assert (
            "warn_renamed" not in path.read_text() and "DeprecationWarning" not in path.read_text()
        ), module
