"""Shared fixtures: a tiny randomly initialised Llama-architecture HookedTransformer and data."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from sae_lens import LoggingConfig
from transformer_lens import HookedTransformer, HookedTransformerConfig

D_MODEL = 32
CONTEXT = 32


@pytest.fixture(scope="session")
def tiny_llama() -> HookedTransformer:
    torch.manual_seed(0)
    cfg = HookedTransformerConfig(
        n_layers=2,
        d_model=D_MODEL,
        n_ctx=64,
        d_head=8,
        n_heads=4,
        n_key_value_heads=2,
        d_mlp=64,
        d_vocab=100,
        act_fn="silu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=8,
        gated_mlp=True,
        final_rms=True,
        original_architecture="LlamaForCausalLM",
    )
    return HookedTransformer(cfg)


@pytest.fixture(scope="session")
def token_dataset() -> Dataset:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 100, (200, CONTEXT), generator=generator)
    return Dataset.from_dict({"input_ids": tokens.tolist()})


def _runner_kwargs(batch: int = 256, steps: int = 20) -> dict:
    return dict(
        model_name="tiny-llama",
        dataset_path="",
        streaming=False,
        context_size=CONTEXT,
        training_tokens=batch * steps,
        train_batch_size_tokens=batch,
        store_batch_size_prompts=16,
        n_batches_in_buffer=32,
        device="cpu",
        prepend_bos=False,
        logger=LoggingConfig(log_to_wandb=False),
        checkpoint_path=None,
    )


@pytest.fixture
def runner_kwargs():
    """Builds LanguageModelSAERunnerConfig / MultiSAETrainingRunnerConfig fields for tiny offline
    runs: ``runner_kwargs(batch=256, steps=20)``."""
    return _runner_kwargs
