"""``bae entropy estimate``: the entropy of the user's own states, from files or a model."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import matplotlib.image
import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from sae_lens_bae.cli import app
from sae_lens_bae.entropy import EntropyRecipe, directional_data
from sae_lens_bae.experiments.entropy_estimate import (
    EstimateConfig,
    harvest_state_sets,
    read_state_sets,
    run,
)

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
    summary = run(EstimateConfig(states=paths, recipe=RECIPE, out=tmp_path / "out"), False)
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


def test_estimate_harvests_a_models_states_end_to_end(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    """Without --states the command reads the model: each of --positions is a set of one state
    per sequence, equal to what run_with_cache gives there; the report, JSON and plot are
    written; no --positions pools every position after BOS into one set."""
    from sae_lens_bae import load_model
    from sae_lens_bae.data import load_token_dataset, token_rows

    quick = ["--steps", "30", "--batch-size", "32", "--expansion", "1", "--seeds", "2",
             "--no-converge", "--restarts", "1", "--repair-rounds", "0",
             "--no-refit-decoder"]  # fmt: skip
    common = ["entropy", "estimate", "--model", str(tiny_hf_llama_dir), "--dataset",
              str(tiny_corpus), "--context-size", "9", "--max-sequences", "40"]  # fmt: skip
    out = tmp_path / "positions"
    result = CliRunner().invoke(app, [*common, "--layer", "0", "--positions", "1,8",
                                      *quick, "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "entropy.json").read_text())
    rows = {row["set"]: row for row in summary["sets"]}
    assert list(rows) == ["blocks.0.hook_resid_post@1", "blocks.0.hook_resid_post@8"]
    assert all((row["n"], row["d"]) == (40, 32) for row in rows.values())
    for row in rows.values():  # 30 steps cannot code 32 dims: flagged, never passed as a reading
        assert row["bits"] >= 0.0 and row["ceiling_bits"] == pytest.approx(np.log2(40), abs=1.0)
        assert not row["reliable"] and (row["bits"] > row["ceiling_bits"]) == (
            "over its ceiling" in result.output.split(row["set"] + ":")[1].split("\n")[0]
        )
    assert all(len(row["bits_per_seed"]) == 2 for row in rows.values())
    assert "| blocks.0.hook_resid_post@8 |" in result.output  # the report, printed
    assert matplotlib.image.imread(out / "entropy.png").shape[-1] in (3, 4)

    model = load_model(str(tiny_hf_llama_dir))
    tokens = token_rows(load_token_dataset(tiny_corpus, model.tokenizer, 9, max_sequences=40))
    cfg = EstimateConfig(model=str(tiny_hf_llama_dir), dataset=str(tiny_corpus), layer=0,
                         context_size=9, max_sequences=40, positions=(1, 8),
                         recipe=RECIPE.changed(batch_size=32))  # fmt: skip
    sets = harvest_state_sets(cfg, progress=False)
    _, cache = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post")
    expected = cache["blocks.0.hook_resid_post"]
    torch.testing.assert_close(sets["blocks.0.hook_resid_post@8"], expected[:, 8])
    pooled = harvest_state_sets(replace(cfg, positions=None), progress=False)
    torch.testing.assert_close(pooled["blocks.0.hook_resid_post"], expected[:, 1:].reshape(-1, 32))

    too_far = CliRunner().invoke(app, [*common, "--positions", "9", "--out", str(tmp_path / "x")])
    assert too_far.exit_code == 2
    assert too_far.output == (
        "Error: positions go up to 8 in sequences of 9 tokens; ask for smaller ones or a "
        "larger --context-size\n"
    )
