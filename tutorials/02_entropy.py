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
from sae_lens_bae.entropy import EntropyRecipe, directional_data, estimate_entropies

torch.manual_seed(0)

# %% [markdown]
# ## Known truth: r fair bits
# The paper's synthetic sets: states c M, c uniform on {0,1}^r, M an orthonormal basis in d = 64.
# A set of r fair bits holds exactly r bits, and a BAE (linear decoder) can reproduce it exactly
# with r code bits. `EntropyRecipe()` trains to convergence (at most 16000 steps).
#
# Training alone does not always find those r code bits. On about a third to a half of such sets
# of 8 bits it settles in a code that writes 3 of the bits as 4 fair code bits: threshold
# functions on the normals of a tetrahedron. They are pairwise uncorrelated, so the covariance
# term cannot see them, and they decode to the 3 bits exactly; the sum of the code bits'
# entropies would read one bit over (9 for 8). The 8-bit set below is one of those sets. The
# recipe then repairs the code (`repair_rounds`, `entropy.repair`): any one of the 4 code bits is
# fixed by the rest of the code on the set's states, so it is switched off and the BAE trains on
# without it, and the retrained BAE is kept because its objective is lower. `knocked_out_bits`
# lists the code bit switched off (docs/research/heldout-sets.md, "A 3-in-4 code").

# %%
ranks = (3, 8)
sets = [directional_data(r, 64, n_train=4096, n_test=0, seed=r)[0] for r in ranks]
# one BAE per set, trained side by side (stacked); each stops when it has converged
cells = estimate_entropies(sets, EntropyRecipe(), seeds=[0] * len(sets), progress=False)
for r, cell in zip(ranks, cells, strict=True):
    print(
        f"r = {r}: estimate {cell.bits:.2f} bits (truth {r}), ceiling {cell.ceiling_bits:.2f}, "
        f"relative error {cell.relative_error:.4f}, excess over the code words "
        f"{'-' if cell.excess_bits is None else f'{cell.excess_bits:.2f}'}, {cell.steps} steps "
        f"(+{cell.repair_steps} repairing), "
        f"knocked-out bits {cell.knocked_out_bits}, reliable: {cell.reliable}"
    )

# %% [markdown]
# ## What the number is: 8 arbitrary states
# Eight random points also hold 3 bits, but they are not an affine image of a 3-bit cube: a
# linear decoder needs at least 7 code bits (8 affinely independent points), and the estimate is
# the *sum of the code bits' entropies*: at least 7 H(1/8) = 3.8 bits, more when the code spreads
# over extra code bits. (Here training ends with one bit per state, 8 H(1/8) = 4.35 bits; any
# one of them is fixed by the other seven, and with it switched off the least-squares decoder
# still reads the states, so the recipe's repair keeps 7 code bits: 3.80 bits.) It lands above
# the ceiling log2(8) = 3, and the cell says it cannot be read as the set's entropy. The same
# holds for any set of fewer states than dimensions: read such cells as an upper bound, never as
# the entropy.

# %%
points = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
(cell,) = estimate_entropies([points[torch.arange(4096) % 8]], EntropyRecipe(), progress=False)
print(
    f"estimate {cell.bits:.2f} bits, ceiling {cell.ceiling_bits:.2f}, "
    f"relative error {cell.relative_error:.4f}, knocked-out bits {cell.knocked_out_bits}, "
    f"reliable: {cell.reliable}"
)

# %% [markdown]
# ## A trace: the state at position p of 512 sequences, at layer 15
# Position 0 is the BOS (one state: 0 bits); later positions depend on more tokens. A small
# budget (2x BAEs, 600 steps of 256) keeps this to a minute or two on a laptop; with 512 states
# per cell the ceiling is 9 bits and, past the first positions, the states are nearly as many as
# they are distinct and far from a cube, so expect the later cells to be flagged. A real trace
# is `bae entropy positions` (more sequences, 3 seeds, larger budgets:
# docs/research/llm-traces.md).

# %%
model = load_model("smollm2-135m")
tokens = torch.as_tensor(
    load_token_dataset(default_corpus(), model.tokenizer, 17, max_sequences=512)["input_ids"]
)
hook = "blocks.15.hook_resid_post"
with torch.no_grad():  # no autograd graph; and no layers (or logits) past the hook
    _, cache = model.run_with_cache(
        tokens, names_filter=[hook], prepend_bos=False, stop_at_layer=16
    )
positions = [0, 1, 2, 4, 8]
sets = [cache[hook][:, p] for p in positions]
cells = estimate_entropies(
    sets, EntropyRecipe(expansion=2, steps=600, batch_size=256), progress=False
)
for p, c in zip(positions, cells, strict=True):
    print(
        f"position {p:2d}: {c.bits:6.2f} bits, ceiling {c.ceiling_bits:5.2f}, "
        f"error {c.relative_error if c.relative_error is not None else 0:.3f}, "
        f"{'reliable' if c.reliable else 'NOT reliable'}"
    )

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
reliable = [c.reliable for c in cells]
ax.plot(positions, [c.bits for c in cells], color="#4a7ab7")
ax.scatter(
    [p for p, r in zip(positions, reliable, strict=True) if r],
    [c.bits for c, r in zip(cells, reliable, strict=True) if r],
    color="#4a7ab7",
    label="reliable",
)
ax.scatter(
    [p for p, r in zip(positions, reliable, strict=True) if not r],
    [c.bits for c, r in zip(cells, reliable, strict=True) if not r],
    facecolors="none",
    edgecolors="#c0392b",
    label="not reliable",
)
ax.plot(positions, [c.ceiling_bits for c in cells], "--", color="gray", label="log2(states)")
ax.axhline(math.log2(len(tokens)), color="gray", lw=0.5)
ax.set(
    xlabel="token position",
    ylabel="entropy (bits)",
    xscale="symlog",
    title="SmolLM2 layer 15: entropy of the states at one position",
)
ax.set_xticks(positions, [str(p) for p in positions])
ax.legend()
plt.tight_layout()
plt.show()
