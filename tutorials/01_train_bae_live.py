"""Train a BAE live from a HookedTransformer's residual stream with SAELens' own runner.

    python tutorials/01_train_bae_live.py [--out runs/tutorial_01] [--steps 300]

Offline and CPU-only: the model is a small randomly initialised Llama-architecture
HookedTransformer and the text is random token ids, so the point is the workflow, not the
features: config -> LanguageModelSAETrainingRunner -> saved BAE -> SAE.load_from_disk -> codes.
Swap in ``HookedTransformer.from_pretrained(...)`` and a real dataset for real use.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from datasets import Dataset
from sae_lens import (
    SAE,
    LanguageModelSAERunnerConfig,
    LanguageModelSAETrainingRunner,
    LoggingConfig,
)
from transformer_lens import HookedTransformer, HookedTransformerConfig

from sae_lens_bae import BAETrainingSAEConfig, fill_training_schedule, reconstruction_loss
from sae_lens_bae.losses import binary_entropy

HOOK = "blocks.2.hook_resid_post"


def tiny_llama(seed: int = 0) -> HookedTransformer:
    torch.manual_seed(seed)
    return HookedTransformer(
        HookedTransformerConfig(
            n_layers=4,
            d_model=64,
            n_ctx=128,
            d_head=16,
            n_heads=4,
            n_key_value_heads=2,
            d_mlp=172,
            d_vocab=512,
            act_fn="silu",
            normalization_type="RMS",
            positional_embedding_type="rotary",
            rotary_dim=16,
            gated_mlp=True,
            final_rms=True,
            original_architecture="LlamaForCausalLM",
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/tutorial_01"))
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()

    model = tiny_llama()
    tokens = torch.randint(1, 512, (2000, 64), generator=torch.Generator().manual_seed(0))
    dataset = Dataset.from_dict({"input_ids": tokens.tolist()})

    cfg = LanguageModelSAERunnerConfig(
        sae=BAETrainingSAEConfig(d_in=64),  # d_sae = 4 * 64, sigmoid surrogate, paper defaults
        model_name="tiny-random-llama",
        hook_name=HOOK,
        dataset_path="",
        is_dataset_tokenized=True,
        streaming=False,
        context_size=64,
        prepend_bos=False,
        training_tokens=512 * args.steps,
        train_batch_size_tokens=512,
        store_batch_size_prompts=32,
        n_batches_in_buffer=16,
        lr=5e-4,
        device="cpu",
        logger=LoggingConfig(log_to_wandb=False),
        output_path=str(args.out),
        checkpoint_path=None,
    )
    fill_training_schedule(cfg)  # entropy term off for the first 25% of the steps
    LanguageModelSAETrainingRunner(cfg, override_dataset=dataset, override_model=model).run()

    bae = SAE.load_from_disk(args.out)  # any SAELens code can load it once sae_lens_bae is imported
    held_out = torch.randint(1, 512, (16, 64), generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(held_out, names_filter=HOOK)
    acts = cache[HOOK].reshape(-1, 64)
    with torch.no_grad():
        codes = bae.encode(acts)
        firing = codes.mean(0)
        summary = {
            "hook": HOOK,
            "held_out_tokens": acts.shape[0],
            "reconstruction_loss": reconstruction_loss(bae(acts), acts).item(),
            "relative_error": ((bae(acts) - acts).pow(2).sum() / acts.pow(2).sum()).item(),
            "entropy_bits": binary_entropy(firing).item(),
            "mean_active_bits": codes.sum(-1).mean().item(),
            "dead_features": int((firing == 0).sum()),
            "dense_features": int((firing > 0.5).sum()),
            "d_sae": bae.cfg.d_sae,
        }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    print(f"BAE and summary written to {args.out}/")


if __name__ == "__main__":
    main()
