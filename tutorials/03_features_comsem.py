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
# # Features: burstiness, top-activating records, and ComSem
#
# A BAE's feature magnitude is its **burstiness** log2|h_B - mean h_B|: a bit in its rare state
# scores near 0, a bit in its usual state near log2 of its rarity. Each token keeps its top-k
# features; the contexts of a feature's records are what ComSem shows an LLM, which explains the
# feature in a phrase and then judges held-out records against it. Here the LLM is the loopback
# server (rule-based answers, offline); point `ClientConfig(base_url=...)` at OpenAI, vLLM, Ollama
# or llama.cpp for real explanations.

# %%
from html import escape

import matplotlib.pyplot as plt
import torch
from IPython.display import HTML, display

from sae_lens_bae import DEFAULT_LR, bae_config, load_model, train_sae
from sae_lens_bae.activations import norm_scale, outlier_mask
from sae_lens_bae.comsem import ClientConfig, ComSemConfig, comsem
from sae_lens_bae.comsem.loopback import LoopbackServer
from sae_lens_bae.data import default_corpus, load_token_dataset
from sae_lens_bae.features import burstiness, code_prior, top_k_records

torch.manual_seed(0)
model = load_model("smollm2-135m")
rows = torch.as_tensor(
    load_token_dataset(default_corpus(), model.tokenizer, 48, max_sequences=160)["input_ids"]
)
hook = "blocks.15.hook_resid_post"
with torch.no_grad():  # no autograd graph; and no layers (or logits) past the hook
    _, cache = model.run_with_cache(rows, names_filter=[hook], prepend_bos=False, stop_at_layer=16)
states = cache[hook][:, 1:].reshape(-1, model.cfg.d_model)  # every token but the BOS
positions = torch.stack(
    torch.meshgrid(torch.arange(rows.shape[0]), torch.arange(1, 48), indexing="ij"), -1
).reshape(-1, 2)
# attention sinks carry "massive activations" (norms 100x the median): they would dominate the
# squared error, so they are dropped, as every command here does
keep = outlier_mask(states)
states, positions = states[keep], positions[keep]
print(f"{int((~keep).sum())} of {keep.numel()} states dropped as outliers")
scale = norm_scale(states)
bae = train_sae(
    states * scale,
    bae_config(states.shape[1], training_steps=400),
    lr=DEFAULT_LR,
    training_samples=400 * 256,
    batch_size=256,
).sae.eval()

# %%
prior = code_prior(bae)
magnitudes = burstiness(bae.encode_bits(states[:2000] * scale), prior)
plt.figure(figsize=(6, 3))
plt.hist(magnitudes.flatten().numpy(), bins=60, log=True)
plt.xlabel("burstiness log2|h_B - p| of every (token, bit)")
plt.ylabel("count")
plt.title("rare states sit near 0, usual ones far below")
plt.tight_layout()
plt.show()

# %%
token_ids = rows[positions[:, 0], positions[:, 1]]
records = top_k_records(
    bae, states * scale, positions, token_ids, "burstiness", k=10, prior=prior, sequences=rows
)
counts = records.counts()
print(f"{int((counts >= 6).sum())} features with at least 6 records (activated, the paper's rule)")


def show(feature: int, n: int = 6) -> None:
    """A feature's strongest contexts, the token highlighted."""
    lines = []
    for index, magnitude in records.samples(feature)[:n]:
        before, token, after = records.context_parts(index, model.tokenizer, before=12, after=4)
        lines.append(
            f"<div style='font-family:monospace'>{magnitude:+.3f} {escape(before)}"
            f"<mark><b>{escape(token)}</b></mark>{escape(after)}</div>"
        )
    display(HTML(f"<h4>feature {feature}</h4>" + "".join(lines)))


for feature in counts.argsort(descending=True)[:3].tolist():
    show(feature)

# %% [markdown]
# ## ComSem over HTTP (the loopback server stands in for the LLM)

# %%
with LoopbackServer() as server:
    client = ClientConfig(model="rules", base_url=server.base_url)
    summary = comsem(
        records, model.tokenizer, client, ComSemConfig(max_features=12), progress=False
    )
print(
    f"{summary['activated']} activated, {summary['evaluated']} evaluated, "
    f"{summary['interpretable']} with score > 0, mean score {summary['mean_score']:.2f}"
)
