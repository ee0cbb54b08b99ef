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

from sae_lens_bae import DEFAULT_LR, bae_config, load_model, steer, task_vector, train_sae
from sae_lens_bae.activations import drop_outliers, norm_scale, prompt_states
from sae_lens_bae.compression import compression_report
from sae_lens_bae.prompts import build_icl_prompts, encode_prompts
from sae_lens_bae.steering import mean_difference

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
    states[name], _, last_states[name] = prompt_states(
        model, tokens, last[:, 0], hook, progress=False
    )
train, dropped = drop_outliers(torch.cat(list(states.values())))  # attention sinks' massive norms
scale = norm_scale(train)
bae = train_sae(
    train * scale,
    bae_config(train.shape[1], training_steps=300),
    lr=DEFAULT_LR,
    training_samples=300 * 256,
    batch_size=256,
).sae.eval()
bae.fold_activation_norm_scaling_factor(scale)  # from here on it reads the states as harvested
print(f"a BAE on {train.shape[0]} token states ({dropped} outliers dropped)")

# %% [markdown]
# ## Steering: the 4-shot minus 0-shot task vector at the last token
# Added to 0-shot prompts of *new* reviews, the vector should make the model answer with a label
# word: the probability of " positive" or " negative" as the next token, against the strength.
# The raw mean difference of the states is the baseline a BAE vector has to match.

# %%
vector = task_vector(bae, last_states["4-shot"], last_states["0-shot"], top=256)
raw = mean_difference(last_states["4-shot"], last_states["0-shot"])
label_ids = [model.to_single_token(" positive"), model.to_single_token(" negative")]
held_out = ["a beautiful, moving story told with great care", "a boring film with no ideas",
            "funny, clever and full of life", "the worst movie i have seen in years",
            "a tender and wonderfully acted drama", "painfully slow and badly edited"]  # fmt: skip
queries = [f"sentence: {sentence} sentiment:" for sentence in held_out]


@torch.no_grad()
def label_mass(v: torch.Tensor, strength: float, prefix: str = "") -> float:
    """Mean next-token probability of the two label words over the held-out 0-shot prompts."""
    mass = []
    for text in queries:
        with steer(model, hook, v, strength):  # positions="last": the prompt's last token
            probs = model(model.to_tokens(prefix + text))[0, -1].softmax(-1)
        mass.append(probs[label_ids].sum().item())
    return sum(mass) / len(mass)


# what real demonstrations give: the level a task vector tries to reach without them
demonstrations = "".join(f"sentence: {x} sentiment: {y}\n" for x, y in REVIEWS[:4])
four_shot = label_mass(vector, 0.0, prefix=demonstrations)
strengths = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0]
curves = {"BAE task vector": [label_mass(vector, a) for a in strengths],
          "raw mean difference": [label_mass(raw, a) for a in strengths]}  # fmt: skip
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, values in curves.items():
    ax.plot(strengths, values, "o-", label=name)
ax.axhline(four_shot, color="gray", ls="--", label="4 real demonstrations, no steering")
ax.set(xlabel="steering strength", ylabel="P(label word) next",
       title="0-shot prompts steered towards the task")  # fmt: skip
ax.legend()
plt.tight_layout()
plt.show()
print(f"4-shot prompts: {four_shot:.3f}")
for name, values in curves.items():
    print(name, " ".join(f"{a:g}: {v:.3f}" for a, v in zip(strengths, values, strict=True)))

# %% [markdown]
# Measured on 2 CPU cores (this BAE: about 600 states, 300 steps): the vector lifts the label words
# from 0.05 to about 0.09 at strength 1 and destroys them past 2, while four real demonstrations
# give 0.9. One vector at one layer of a 135M model carries a little of the task, and the BAE's
# sparse version does as well as the raw difference; `bae steer icl` is the full study.

# %%
best = strengths[max(range(len(strengths)), key=lambda i: curves["BAE task vector"][i])]
prompt = queries[0]
kwargs = dict(max_new_tokens=4, do_sample=False, verbose=False)
print("no steering:", repr(model.generate(prompt, **kwargs)[len(prompt) :]))
with steer(model, hook, vector, strength=best):
    print(f"steered ({best:g}):", repr(model.generate(prompt, **kwargs)[len(prompt) :]))

# %% [markdown]
# ## Compression: bytes against fidelity as the threshold on burstiness rises

# %%
rows = compression_report(bae, train, (-1.0, -0.75, -0.5, -0.25, 0.0))
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot([r["ratio_float32"] for r in rows], [r["cosine"] for r in rows], "o-")
for r in rows:
    ax.annotate(f"{r['threshold']:+.2f}", (r["ratio_float32"], r["cosine"]))
ax.set(
    xlabel="compression ratio against float32",
    ylabel="mean cosine to the originals",
    title="stored flips: fewer bytes, less of the state",
)
plt.tight_layout()
plt.show()
for r in rows:
    print(
        f"threshold {r['threshold']:+.2f}: {r['flips_per_vector']:6.1f} flips/state, "
        f"{r['ratio_float32']:6.1f}x smaller, cosine {r['cosine']:.3f}"
    )
