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
# # The entropy of sets of hidden states, and a small trace
#
# A BAE trained on a set of hidden states gives its entropy as H(mean of the binary code) in bits.
# It can be trusted when the BAE reconstructs the set (relative error <= 20%) and the estimate
# stays under the ceiling log2(number of distinct states). First a case whose truth is known,
# then a trace over token positions of SmolLM2.

# %%
import math

import matplotlib.pyplot as plt
import torch

from sae_lens_bae import load_model
from sae_lens_bae.data import default_corpus, load_token_dataset
from sae_lens_bae.entropy import EntropyRecipe, estimate_entropies

torch.manual_seed(0)
recipe = EntropyRecipe(steps=800, seeds=1)  # a small budget; it stops early once converged

# %% [markdown]
# ## Known truth: 8 equally likely states carry 3 bits

# %%
points = torch.randn(8, 64)
eight = points[torch.arange(4096) % 8]
(cell,) = estimate_entropies([eight], recipe, progress=False)
print(f"estimate {cell.bits:.2f} bits (truth 3), ceiling {cell.ceiling_bits:.2f}, "
      f"relative error {cell.relative_error:.3f}, reliable: {cell.reliable}")

# %% [markdown]
# ## A trace: the state at position p of 512 sequences, at layer 15
# Position 0 is the BOS (one state: 0 bits); later positions depend on more tokens.

# %%
model = load_model("smollm2-135m")
tokens = torch.as_tensor(
    load_token_dataset(default_corpus(), model.tokenizer, 17, max_sequences=512)["input_ids"]
)
hook = "blocks.15.hook_resid_post"
_, cache = model.run_with_cache(tokens, names_filter=[hook], prepend_bos=False)
positions = [0, 1, 2, 4, 8, 16]
sets = [cache[hook][:, p] for p in positions]
cells = estimate_entropies(sets, recipe, progress=False)
for p, c in zip(positions, cells, strict=True):
    print(f"position {p:2d}: {c.bits:6.2f} bits, ceiling {c.ceiling_bits:5.2f}, "
          f"error {c.relative_error if c.relative_error is not None else 0:.3f}, "
          f"{'reliable' if c.reliable else 'NOT reliable'}")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
reliable = [c.reliable for c in cells]
ax.plot(positions, [c.bits for c in cells], color="#4a7ab7")
ax.scatter([p for p, r in zip(positions, reliable) if r],
           [c.bits for c, r in zip(cells, reliable) if r], color="#4a7ab7", label="reliable")
ax.scatter([p for p, r in zip(positions, reliable) if not r],
           [c.bits for c, r in zip(cells, reliable) if not r], facecolors="none",
           edgecolors="#c0392b", label="not reliable")
ax.plot(positions, [c.ceiling_bits for c in cells], "--", color="gray", label="log2(states)")
ax.axhline(math.log2(len(tokens)), color="gray", lw=0.5)
ax.set(xlabel="token position", ylabel="entropy (bits)", xscale="symlog",
       title="SmolLM2 layer 15: entropy of the states at one position")
ax.legend()
plt.tight_layout()
plt.show()
