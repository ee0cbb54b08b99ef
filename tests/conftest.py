"""Shared fixtures: a tiny randomly initialised Llama-architecture HookedTransformer and data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def _save_word_tokenizer(path: Path) -> None:
    """A word-level tokenizer over ``w3``..``w99`` (BOS ``<s>``, EOS ``</s>``), built here from the
    ``tokenizers`` library: no download."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 100)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.save_pretrained(path)


@pytest.fixture(scope="session")
def tiny_hf_llama_dir(tmp_path_factory) -> Path:
    """A randomly initialised Llama checkpoint in Hugging Face format with a word-level tokenizer,
    written the way a user's local model directory looks (config, safetensors, tokenizer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny_hf_llama")
    _save_word_tokenizer(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=128,
        rope_theta=5000.0,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_hf_granite_dir(tmp_path_factory) -> Path:
    """A randomly initialised ``GraniteForCausalLM`` folder (config, safetensors, the word-level
    tokenizer): an architecture ``HookedTransformer`` has no converter for, which ``load_model``
    boots through TransformerLens' ``TransformerBridge``. Granite's own multipliers (embedding,
    residual, attention, logits) are all away from 1, so a bridge that skipped one would differ
    from the Hugging Face model; weights drawn wider than the default so that the logits are far
    from uniform and a splice visibly moves them."""
    from transformers import GraniteConfig, GraniteForCausalLM

    path = tmp_path_factory.mktemp("tiny_hf_granite")
    _save_word_tokenizer(path)
    torch.manual_seed(0)
    config = GraniteConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=128,
        initializer_range=0.2,
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        attention_multiplier=0.25,
        logits_scaling=2.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    GraniteForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """A text file of 'sentences' in the tiny tokenizer's vocabulary."""
    generator = torch.Generator().manual_seed(1)
    lines = [
        " ".join(f"w{int(i)}" for i in torch.randint(3, 100, (int(n),), generator=generator))
        for n in torch.randint(5, 40, (400,), generator=generator)
    ]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


class TrainingSteps:
    """Counts the stacked training steps taken (one loss record each) and kills a run after a
    given number: what a kill-and-rerun test needs. Every stacked run checkpoints each step."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from sae_lens_bae.stacks import training as stacked
        from sae_lens_bae.training.deferred import LossHistory

        monkeypatch.setattr(stacked, "CHECKPOINT_SECONDS", 0.0)
        self.taken, self.kill_after = 0, None
        record = LossHistory.record

        def counted(history: LossHistory, *args: object) -> None:
            if self.kill_after is not None and self.taken >= self.kill_after:
                raise KeyboardInterrupt
            self.taken += 1
            record(history, *args)

        monkeypatch.setattr(LossHistory, "record", counted)

    def kill(self, after: int) -> None:
        """Interrupt the next run after ``after`` steps (counted from now)."""
        self.taken, self.kill_after = 0, after

    def count(self) -> None:
        """Count the next run's steps without interrupting it."""
        self.taken, self.kill_after = 0, None


@pytest.fixture
def training_steps(monkeypatch) -> TrainingSteps:
    return TrainingSteps(monkeypatch)


@pytest.fixture
def count_calls(monkeypatch):
    """``count_calls(owner, name)``: a list that gets one entry per call of ``owner.name``
    (which still runs) for the rest of the test."""

    def install(owner: object, name: str) -> list[int]:
        calls: list[int] = []
        original = getattr(owner, name)

        def counted(*args: object, **kwargs: object) -> object:
            calls.append(1)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
        return calls

    return install


@pytest.fixture
def phases_applied(monkeypatch):
    """Every BAE training step taken for the rest of the test, in order: ``(step, {term: the
    coefficient applied, as SAELens' trainer logs it}, {term: the config's coefficient})``;
    ``.phases()`` reads each as ``(step, entropy on, covariance on)``."""
    from sae_lens_bae import BAETrainingSAE

    class Steps(list):
        def phases(self) -> list[tuple[int, bool, bool]]:
            """Each step's terms on or off: an applied coefficient is exactly the config's
            (on) or exactly 0 (off); anything else is kept as the value, to fail a comparison."""
            return [(n, *(on(value, weights[name]) for name, value in terms.items()))
                    for n, terms, weights in self]  # fmt: skip

    def on(value: float, coefficient: float) -> bool | float:
        return {coefficient: True, 0.0: False}.get(value, value)

    taken = Steps()
    original = BAETrainingSAE.training_forward_pass

    def recorded(sae: BAETrainingSAE, step_input: Any) -> Any:
        output = original(sae, step_input)
        terms = {
            name: output.metrics[f"{name}_coefficient_applied"]()
            for name in ("entropy", "covariance")
        }
        taken.append((step_input.n_training_steps, terms, sae.cfg.coefficients()))
        return output

    monkeypatch.setattr(BAETrainingSAE, "training_forward_pass", recorded)
    return taken
