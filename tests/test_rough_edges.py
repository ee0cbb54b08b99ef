"""What a new user meets first: SAELens' override warnings on every ``bae train``, a missing
dataset reported only after the model has loaded, and the order of a BAE feature's dashboard
contexts when their burstiness ties."""

from __future__ import annotations

import logging

import pytest
from typer.testing import CliRunner

from sae_lens_bae import models
from sae_lens_bae.cli import app

runner = CliRunner(env={"COLUMNS": "300"})


def test_bae_train_shows_no_override_warnings(tiny_hf_llama_dir, tiny_corpus, tmp_path, caplog):
    """The runner gets the command's own tokenised rows and model: SAELens' "not reproducible via
    configuration alone" warnings would repeat on every run; its other warnings still show."""
    args = ["train", "--model", str(tiny_hf_llama_dir), "--dataset", str(tiny_corpus),
            "--hook", "blocks.1.hook_resid_post", "--context-size", "32",
            "--training-tokens", "256", "--batch-size", "128", "--checkpoints", "0",
            "--out", str(tmp_path / "bae")]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="sae_lens"):
        result = runner.invoke(app, args)
        logging.getLogger("sae_lens").warning("a warning of SAELens' own")
    assert result.exit_code == 0, result.output
    messages = [record.getMessage() for record in caplog.records]
    assert not [m for m in messages if "reproducible" in m], messages
    assert "a warning of SAELens' own" in messages  # the filter is gone after the run
    assert (tmp_path / "bae" / "cfg.json").is_file()


COMMANDS = {
    "quickstart": ["quickstart"],
    "compare": ["compare"],
    "compress": ["compress"],
    "train": ["train"],
    "entropy estimate": ["entropy", "estimate"],
    "entropy positions": ["entropy", "positions"],
    "bench more-bits": ["bench", "more-bits"],
}
"""Every command that reads a text dataset through a model, by its words on the command line."""


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_missing_dataset_fails_before_the_model_loads(
    command, tiny_hf_llama_dir, tmp_path, count_calls
):
    loads = count_calls(models, "_load_local_llama")
    missing = tmp_path / "no_such_corpus.txt"
    args = [*COMMANDS[command], "--model", str(tiny_hf_llama_dir), "--dataset", str(missing),
            "--out", str(tmp_path / "out")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"No such file or folder: {missing}" in result.output
    assert loads == []  # said before any model was loaded
