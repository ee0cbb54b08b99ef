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
# # Steering with a task vector, and compressing hidden states
#
# A BAE's codes of 4-shot and 0-shot sentiment prompts differ in a few bits; their decoded
# difference is a **task vector**, added to the residual stream through TransformerLens hooks
# while the model generates. The same codes compress hidden states: store only the bits that
# differ from the usual code.

# %%
import matplotlib.pyplot as plt
import torch

from sae_lens_bae import BAETrainingSAEConfig, DEFAULT_LR, load_model, steer, task_vector, train_sae
from sae_lens_bae.activations import norm_scale, prompt_states
from sae_lens_bae.compression import compression_report
from sae_lens_bae.prompts import build_icl_prompts, encode_prompts

REVIEWS = [
    ("a gorgeous, witty and deeply moving film", "positive"),
    ("the plot is a tedious mess from start to finish", "negative"),
    ("one of the most charming comedies of the year", "positive"),
    ("dull characters and a script that goes nowhere", "negative"),
    ("a smart, funny and beautifully acted story", "positive"),
    ("an exhausting, joyless two hours", "negative"),
    ("the cast is wonderful and the ending is perfect", "positive"),
    ("clumsy, loud and utterly forgettable", "negative"),
    ("a warm and inventive delight", "positive"),
    ("badly written and even worse directed", "negative"),
    ("sharp dialogue and a terrific lead performance", "positive"),
    ("a lazy sequel with nothing new to say", "negative"),
]
torch.manual_seed(0)
model = load_model("smollm2-135m")
hook = "blocks.15.hook_resid_post"
states, last_states = {}, {}
for name, shots in (("4-shot", 4), ("0-shot", 0)):
    prompts = build_icl_prompts(REVIEWS, shots, 8, seed=0)
    tokens, last = encode_prompts([p for p, _ in prompts], model.tokenizer)
    states[name], _, last_states[name] = prompt_states(model, tokens, last[:, 0], hook,
                                                       progress=False)
train = torch.cat(list(states.values()))
scale = norm_scale(train)
bae = train_sae(train * scale, BAETrainingSAEConfig(d_in=train.shape[1]), lr=DEFAULT_LR,
                training_samples=300 * 256, batch_size=256).sae.eval()
print(f"a BAE on {train.shape[0]} token states")

# %% [markdown]
# ## Steering: the 4-shot minus 0-shot task vector at the last token

# %%
vector = task_vector(bae, last_states["4-shot"], last_states["0-shot"], top=256, input_scale=scale)
prompt = "sentence: an unforgettable, heartfelt film sentiment:"
kwargs = dict(max_new_tokens=4, do_sample=False, verbose=False)
print("no steering:", repr(model.generate(prompt, **kwargs)[len(prompt):]))
with steer(model, hook, vector, strength=2.0):
    print("steered:    ", repr(model.generate(prompt, **kwargs)[len(prompt):]))

# %% [markdown]
# ## Compression: bytes against fidelity as the threshold on burstiness rises

# %%
rows = compression_report(bae, train, (-1.0, -0.75, -0.5, -0.25, 0.0), input_scale=scale)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot([r["ratio_float32"] for r in rows], [r["cosine"] for r in rows], "o-")
for r in rows:
    ax.annotate(f"{r['threshold']:+.2f}", (r["ratio_float32"], r["cosine"]))
ax.set(xlabel="compression ratio against float32", ylabel="mean cosine to the originals",
       title="stored flips: fewer bytes, less of the state")
plt.tight_layout()
plt.show()
for r in rows:
    print(f"threshold {r['threshold']:+.2f}: {r['flips_per_vector']:6.1f} flips/state, "
          f"{r['ratio_float32']:6.1f}x smaller, cosine {r['cosine']:.3f}")
