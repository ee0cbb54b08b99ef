"""What a new user meets first: SAELens' override warnings on every ``bae train``, a missing
dataset reported only after the model has loaded, and the order of a BAE feature's dashboard
contexts when their burstiness ties."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoTokenizer
from typer.testing import CliRunner

from sae_lens_bae import BAE, BAEConfig, models
from sae_lens_bae.cli import app
from sae_lens_bae.dashboard import build_pages
from sae_lens_bae.features import FeatureRecords, top_k_records

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


def test_dashboard_contexts_of_tied_burstiness_come_by_pre_activation_margin(tiny_hf_llama_dir):
    """A BAE bit's burstiness takes one value wherever the bit is in its rare state, so every
    record of a feature ties: the page shows the records whose bit is farthest from flipping
    first, not the data's first tokens."""
    torch.manual_seed(0)
    bae = BAE(BAEConfig(d_in=8, d_sae=16))
    x = torch.randn(200, 8, generator=torch.Generator().manual_seed(1))
    sequences = torch.randint(3, 100, (20, 10), generator=torch.Generator().manual_seed(2))
    positions = torch.stack([torch.arange(200) // 10, torch.arange(200) % 10], dim=1)
    prior = bae.encode_bits(x).mean(0).clamp(0.02, 0.98)
    records = top_k_records(bae, x, positions, sequences.flatten(), "burstiness", k=4,
                            prior=prior, sequences=sequences)  # fmt: skip
    _, cache = bae.run_with_cache(x)  # SAELens' hook of the pre-activations
    margin = cache["hook_sae_acts_pre"].abs()
    feature = int(records.counts().argmax())
    ranked = records.samples(feature)
    assert len({round(m, 5) for _, m in ranked}) < len(ranked)  # burstiness ties
    expected = sorted(ranked, key=lambda r: (-round(r[1], 5), -float(margin[r[0], feature])))
    assert [i for i, _ in ranked] == [i for i, _ in expected]
    assert [i for i, _ in ranked] != sorted(i for i, _ in ranked)  # not the data order
    tokenizer = AutoTokenizer.from_pretrained(tiny_hf_llama_dir)
    page = build_pages(records, tokenizer, contexts=5, features=[feature])[0]
    first = [records.context_parts(i, tokenizer)[1] for i, _ in expected[:5]]
    assert [context.token for context in page.contexts] == first


def test_records_keep_their_margins_through_a_save(tmp_path):
    bae = BAE(BAEConfig(d_in=8, d_sae=16))
    x = torch.randn(50, 8, generator=torch.Generator().manual_seed(0))
    records = top_k_records(bae, x, torch.zeros(50, 2, dtype=torch.long),
                            torch.zeros(50, dtype=torch.long), "burstiness", k=3,
                            prior=torch.full((16,), 0.3))  # fmt: skip
    records.save(tmp_path / "r.safetensors")
    loaded = FeatureRecords.load(tmp_path / "r.safetensors")
    assert loaded.margins is not None and torch.equal(loaded.margins, records.margins)
    assert (records.margins > 0).all()


def test_a_hub_dataset_name_may_pick_a_configuration(monkeypatch):
    """What the docs point users at: ``Salesforce/wikitext:wikitext-2-raw-v1`` is WikiText-2's
    configuration of the hub dataset (asked of the hub, never here)."""
    from sae_lens_bae import data

    asked = []
    monkeypatch.setattr(data, "load_dataset", lambda *a, **k: asked.append((a, k)) or [])
    list(data.iter_texts("Salesforce/wikitext:wikitext-2-raw-v1", split="validation"))
    list(data.iter_texts("stanfordnlp/sst2"))
    assert asked == [
        (("Salesforce/wikitext", "wikitext-2-raw-v1"), {"split": "validation", "streaming": True}),
        (("stanfordnlp/sst2", None), {"split": "train", "streaming": True}),
    ]
