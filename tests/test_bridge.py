"""Models ``HookedTransformer`` cannot convert, booted through TransformerLens'
``TransformerBridge``: a tiny ``GraniteForCausalLM`` folder (random weights, no download), its
hidden states and logits against the Hugging Face model's own, splicing through SAELens'
``SAETransformerBridge``, the commands end to end on it, and stories260K (a trained Llama)
through both routes when ``../shared`` is there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sae_lens import HookedSAETransformer, SAETransformerBridge
from transformer_lens import HookedTransformer
from transformer_lens.model_bridge import TransformerBridge
from transformers import AutoConfig, AutoModelForCausalLM
from typer.testing import CliRunner

from sae_lens_bae import BAE, BAEConfig, harvest_activations, load_model
from sae_lens_bae.activations import gather_states
from sae_lens_bae.cli import app
from sae_lens_bae.models import hooked_config_from_hf
from sae_lens_bae.steering import SteeredClassifier, label_accuracy, steering_hook

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
STORIES = SHARED / "models" / "stories260K"
runner = CliRunner(env={"COLUMNS": "300"})


@pytest.fixture(scope="module")
def bridge(tiny_hf_granite_dir) -> TransformerBridge:
    return load_model(tiny_hf_granite_dir)


@pytest.fixture(scope="module")
def hf_granite(tiny_hf_granite_dir):
    # eager attention, as the bridge runs it (sdpa reorders the sums at the 1e-7 level)
    return AutoModelForCausalLM.from_pretrained(
        tiny_hf_granite_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def _tokens(seed: int = 0, shape: tuple[int, int] = (3, 12)) -> torch.Tensor:
    tokens = torch.randint(3, 100, shape, generator=torch.Generator().manual_seed(seed))
    tokens[:, 0] = 1  # BOS, as every row here starts
    return tokens


def test_hooked_transformer_has_no_converter_for_granite_so_the_bridge_loads_it(
    bridge, tiny_hf_granite_dir
):
    with pytest.raises(ValueError, match="GraniteForCausalLM"):
        hooked_config_from_hf(AutoConfig.from_pretrained(tiny_hf_granite_dir))
    assert isinstance(bridge, TransformerBridge) and not isinstance(bridge, HookedTransformer)
    assert bridge.cfg.n_layers == 3 and bridge.cfg.d_model == 32
    assert {f"blocks.{n}.hook_resid_post" for n in range(3)} <= set(bridge.hook_dict)
    tokens = bridge.to_tokens("w5 w6 w7")  # one BOS, as every model here prepends
    assert tokens.tolist() == [[1, 5, 6, 7]]


def test_bridge_states_and_logits_equal_the_hf_models_own(bridge, hf_granite):
    tokens = _tokens()
    with torch.no_grad():
        theirs = hf_granite(tokens, output_hidden_states=True)
        logits, cache = bridge.run_with_cache(tokens)
    # hidden_states[l + 1] is block l's output, but the last one is taken after the final norm
    for layer in range(bridge.cfg.n_layers - 1):
        ours = cache[f"blocks.{layer}.hook_resid_post"]
        assert torch.allclose(ours, theirs.hidden_states[layer + 1], rtol=0, atol=1e-6), layer
        assert ours.abs().max() > 0.1  # not a vacuous comparison of zeros
    assert torch.allclose(logits, theirs.logits, rtol=0, atol=1e-5)  # logits_scaling included
    assert logits.std() > 0.3  # far from uniform: a splice has something to move


@pytest.mark.parametrize("model_dir", ["tiny_hf_llama_dir", "tiny_hf_granite_dir"])
def test_load_model_gives_an_eval_model_with_frozen_weights_yet_gradients_through_hooks(
    model_dir, request
):
    model = load_model(request.getfixturevalue(model_dir))
    assert not model.training
    assert all(not p.requires_grad for p in model.parameters())
    logits = model(_tokens())
    assert logits.grad_fn is None  # no graph kept over the weights: a harvest's memory
    push = torch.zeros(model.cfg.d_model, requires_grad=True)
    steered = model.run_with_hooks(
        _tokens(),
        fwd_hooks=[("blocks.0.hook_resid_post", lambda acts, hook: acts + push)],  # noqa: ARG005
    )
    steered[:, -1].logsumexp(-1).sum().backward()  # not inference-mode tensors: autograd works
    assert push.grad is not None and push.grad.abs().sum() > 0


@pytest.mark.parametrize("bits_per_feature", [1, 2])
def test_run_with_saes_on_the_bridge_replaces_the_hook_by_the_bae_reconstruction(
    tiny_hf_granite_dir, bridge, bits_per_feature
):
    model = load_model(tiny_hf_granite_dir, model_class=HookedSAETransformer)
    assert isinstance(model, SAETransformerBridge)
    hook = "blocks.1.hook_resid_post"
    torch.manual_seed(bits_per_feature)
    bae = BAE(BAEConfig(d_in=32, d_sae=48, bits_per_feature=bits_per_feature))
    with torch.no_grad():
        bae.W_dec.normal_(0, 0.3)
    bae.cfg.metadata.hook_name = hook
    tokens = _tokens(1)
    spliced = model.run_with_saes(tokens, saes=[bae])
    replaced = bridge.run_with_hooks(
        tokens,
        fwd_hooks=[(hook, lambda acts, hook: bae.decode(bae.encode(acts)))],  # noqa: ARG005
    )
    assert torch.allclose(spliced, replaced, rtol=0, atol=1e-6)
    assert (spliced - bridge(tokens)).abs().max() > 0.1  # the splice does change the logits
    assert model.acts_to_saes == {}  # run_with_saes leaves the model as it was


def test_harvest_and_gathered_states_on_the_bridge(bridge, hf_granite, tmp_path):
    tokens = _tokens(2, (4, 10))
    cache = harvest_activations(
        bridge, tokens, ["blocks.0.hook_resid_post"], tmp_path / "c", dtype="float32"
    )
    with torch.no_grad():
        hidden = hf_granite(tokens, output_hidden_states=True).hidden_states[1]
    harvested = cache.activations("blocks.0.hook_resid_post")
    assert torch.allclose(harvested, hidden[:, 1:].reshape(-1, 32), atol=1e-6)  # BOS dropped
    positions = torch.tensor([[1, 4]] * 4)
    states, logits = gather_states(
        bridge, tokens, ["blocks.0.hook_resid_post"], positions, logit_tokens=[5, 9],
        progress=False,
    )  # fmt: skip
    with torch.no_grad():
        full = hf_granite(tokens).logits  # the head's logits, logits_scaling included
    assert torch.allclose(states["blocks.0.hook_resid_post"], hidden[:, [1, 4]], atol=1e-6)
    assert torch.allclose(logits, full[:, [1, 4]][..., [5, 9]], atol=1e-5)


def test_steered_classifier_on_the_bridge_equals_a_full_forward(bridge):
    tokens, last = _tokens(3, (10, 8)), torch.randint(3, 8, (10,))
    truth = torch.randint(0, 2, (10,), generator=torch.Generator().manual_seed(0))
    hook, ids = "blocks.1.hook_resid_post", [5, 6]
    vector = torch.randn(32, generator=torch.Generator().manual_seed(1))
    classifier = SteeredClassifier(bridge, tokens, last, ids, truth, hook, batch_size=4)
    accuracies = set()
    for strength in (0.0, 3.0, 30.0):
        full = label_accuracy(bridge, tokens, last, ids, truth, hook_name=hook, vector=vector,
                              strength=strength, batch_size=3)  # fmt: skip
        assert classifier.accuracy(vector, strength) == full
        accuracies.add(full)
    steered = bridge.run_with_hooks(tokens, fwd_hooks=[(hook, steering_hook(vector, 30.0))])
    assert not torch.allclose(steered, bridge(tokens))  # the steering hook reaches the bridge


def test_an_unreachable_hub_name_ends_in_one_line(monkeypatch):
    def offline(name, **kwargs):  # noqa: ARG001
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck")

    monkeypatch.setattr(TransformerBridge, "boot_transformers", offline)
    with pytest.raises(ValueError, match=r"'ibm-granite/granite-3.0-2b-base' through .*connect"):
        load_model("ibm-granite/granite-3.0-2b-base")
    with pytest.raises(ValueError, match="unknown model name 'granite'"):
        load_model("granite")  # not owner/name: never asks the hub


def test_commands_end_to_end_on_the_bridge_only_model(tiny_hf_granite_dir, tiny_corpus, tmp_path):
    model, text = ["--model", str(tiny_hf_granite_dir)], ["--dataset", str(tiny_corpus)]
    quick = runner.invoke(app, ["quickstart", *model, *text, "--steps", "20",
                                "--context-size", "32", "--max-sequences", "96",
                                "--out", str(tmp_path / "q")])  # fmt: skip
    assert quick.exit_code == 0, quick.output
    metrics = json.loads((tmp_path / "q" / "metrics.json").read_text())
    assert metrics["hook"] == "blocks.1.hook_resid_post"  # the middle of 3 layers
    assert metrics["models"]["bae"]["kl_div_with_sae"] > 0  # spliced into the bridge
    entropy = runner.invoke(app, ["entropy", "estimate", *model, *text, "--context-size", "32",
                                  "--max-sequences", "48", "--steps", "30",
                                  "--out", str(tmp_path / "e")])  # fmt: skip
    assert entropy.exit_code == 0, entropy.output
    assert "| blocks.1.hook_resid_post |" in entropy.output
    compare = runner.invoke(app, ["compare", *model, *text, "--context-size", "32",
                                  "--max-sequences", "96", "--held-out-fraction", "0.15",
                                  "--families", "bae,topk", "--bae-scales", "1", "--topk-k", "4",
                                  "--d-sae", "32", "--steps", "12", "--batch-size", "64",
                                  "--records-k", "4", "--spliced-sequences", "2",
                                  "--probe-sentences", "40",
                                  "--out", str(tmp_path / "c")])  # fmt: skip
    assert compare.exit_code == 0, compare.output
    rows = json.loads((tmp_path / "c" / "compare.json").read_text())["rows"]
    assert all(row["kl"] >= 0 for row in rows if row["split"] == "test")
    records = tmp_path / "c" / "records" / "bae.safetensors"
    site = runner.invoke(app, ["dashboard", "--records", str(records),
                               "--sae", str(tmp_path / "c" / "models" / "bae"),
                               "--out", str(tmp_path / "d")])  # fmt: skip
    assert site.exit_code == 0, site.output  # the logit lens through the bridge's unembedding
    assert "feature" in (tmp_path / "d" / "index.html").read_text()
    train = runner.invoke(app, ["train", *model, *text, "--context-size", "32",
                                "--training-tokens", "256", "--batch-size", "128",
                                "--checkpoints", "0", "--out", str(tmp_path / "t")])  # fmt: skip
    assert train.exit_code == 0, train.output  # SAELens' runner on the booted bridge
    assert json.loads((tmp_path / "t" / "cfg.json").read_text())["d_in"] == 32


@pytest.mark.skipif(not STORIES.is_dir(), reason=f"needs {STORIES} (../shared, not in a clone)")
def test_stories260k_through_the_bridge_matches_its_hooked_transformer(tmp_path):
    """A trained Llama both ways: TransformerLens' converter and the bridge read the same states,
    and a BAE trained on the bridge's harvest splices into both alike."""
    from sae_lens_bae.evaluation import spliced_losses
    from sae_lens_bae.models import _boot_bridge
    from sae_lens_bae.training import family_config, train_sae

    hooked = load_model(STORIES)
    bridge = _boot_bridge(str(STORIES), "cpu", torch.float32, splicing=False)
    tokens = hooked.to_tokens(["Once upon a time, there was a little girl named Lily."] * 2)
    hook = "blocks.2.hook_resid_post"
    ours, theirs = (
        harvest_activations(m, tokens, [hook], tmp_path / name, dtype="float32").activations(hook)
        for name, m in (("bridge", bridge), ("hooked", hooked))
    )
    assert torch.allclose(ours, theirs, atol=1e-4) and ours.abs().max() > 0.1
    cfg = family_config("bae", 64, 128, 1.0, 40)
    bae = train_sae(ours.repeat(40, 1), cfg, training_samples=40 * 64, batch_size=64).sae.eval()
    through = {name: spliced_losses(m, {"bae": bae}, tokens, hook)["bae"]
               for name, m in (("bridge", bridge), ("hooked", hooked))}  # fmt: skip
    for key in ("ce_loss_without_sae", "ce_loss_with_sae", "kl_div_with_sae"):
        assert through["bridge"][key] == pytest.approx(through["hooked"][key], rel=1e-3, abs=1e-5)
