"""``bae entropy estimate``: the entropy of states read from the user's own files."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from sae_lens_bae.cli import app
from sae_lens_bae.entropy import EntropyRecipe, directional_data
from sae_lens_bae.entropy.files import EstimateConfig, estimate, read_state_sets

RECIPE = EntropyRecipe.of(expansion=2, steps=2000, batch_size=256, lr=4e-3, seeds=1)


@pytest.mark.slow
def test_planted_bits_in_every_kind_of_file_read_at_their_entropy(tmp_path):
    """Two planted bits and a constant set, in a .pt dict, an .npy and a .safetensors file: the
    planted sets read 2 bits and are trusted, the constant set reads 0 (its ceiling)."""
    two, _ = directional_data(2, d=16, n_train=2048, n_test=8, seed=3)
    constant = torch.ones(512, 16)
    torch.save({"two": two, "constant": constant}, tmp_path / "sets.pt")
    np.save(tmp_path / "two.npy", two.numpy())
    save_file({"layer": two.clone()}, str(tmp_path / "more.safetensors"))
    paths = [tmp_path / "sets.pt", tmp_path / "two.npy", tmp_path / "more.safetensors"]
    summary = estimate(EstimateConfig(states=paths, recipe=RECIPE, out=tmp_path / "out"), False)
    rows = {row["set"]: row for row in summary["sets"]}
    assert list(rows) == ["sets:two", "sets:constant", "two", "more:layer"]
    for name in ("sets:two", "two", "more:layer"):
        assert rows[name]["bits"] == pytest.approx(2.0, abs=0.05) and rows[name]["reliable"]
        assert rows[name]["ceiling_bits"] == 2.0
        assert (rows[name]["n"], rows[name]["d"]) == (2048, 16)
    assert rows["sets:constant"]["bits"] == pytest.approx(0.0, abs=1e-6)
    assert json.loads((tmp_path / "out" / "entropy.json").read_text())["sets"] == summary["sets"]
    assert "| sets:two |" in (tmp_path / "out" / "entropy.md").read_text()


def test_bad_state_files_are_refused_in_one_line(tmp_path):
    torch.save(torch.zeros(5), tmp_path / "flat.pt")
    (tmp_path / "text.pt").write_text("not a tensor")
    np.save(tmp_path / "nan.npy", np.full((4, 3), np.nan, dtype=np.float32))
    (tmp_path / "states.csv").write_text("1,2\n3,4\n")
    cases = {"flat.pt": "is not a set of states [n >= 2, d] ((5,))",
             "text.pt": "is not a torch file of states", "nan.npy": "NaN or infinite",
             "states.csv": "states come in .pt, .npy or .safetensors"}  # fmt: skip
    for name, message in cases.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            read_state_sets([tmp_path / name])
    missing = str(tmp_path / "none.pt")
    result = CliRunner().invoke(app, ["entropy", "estimate", "--states", missing])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "states: no path" in result.output
    result = CliRunner().invoke(app, ["entropy", "estimate", "--states", str(tmp_path / "flat.pt"),
                                      "--out", str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 2 and "is not a set of states" in result.output
