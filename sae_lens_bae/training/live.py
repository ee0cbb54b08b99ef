"""``bae train``: a BAE trained live on a model's hook point with SAELens' training runner.

Activations come from the model's forward passes as training goes (SAELens'
``LanguageModelSAETrainingRunner``), never from a cache: the route for long runs on large corpora.
``BAETrainingRunner`` is that runner with an exactly resumable activation store
(``ResumableActivationsStore``) and checkpoints marked complete when written: ``bae train
--resume PATH`` continues a killed run on the minibatches it would have seen.
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from sae_lens import LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner, LoggingConfig
from sae_lens.saes.sae import SAEConfig
from sae_lens.training.sae_trainer import SAETrainer

from sae_lens_bae.activations.hooks import check_hooks
from sae_lens_bae.activations.store import ResumableActivationsStore
from sae_lens_bae.data import load_token_dataset, token_rows
from sae_lens_bae.models import load_model
from sae_lens_bae.saes.bae_config import BAE_PRESETS, bae_config
from sae_lens_bae.training.checkpoints import latest_checkpoint, mark_complete, read_marker
from sae_lens_bae.training.trainer import fill_training_schedule

__all__ = ["BAETrainingRunner", "LiveTrainingConfig", "train_live"]

Normalisation = typing.get_type_hints(SAEConfig)["normalize_activations"]
"""SAELens' activation normalisations (``none``, ``expected_average_only_in``, ...)."""


@dataclass
class LiveTrainingConfig:
    """What ``bae train`` runs: one BAE on one hook point, trained on live activations."""

    out: Path
    """Folder for the trained BAE (SAELens format); checkpoints go to OUT/checkpoints."""
    dataset: str
    """Text file, folder of files, or HF dataset name."""
    model: str = "smollm2-135m"
    """Embedded name, local HF directory or TransformerLens name."""
    hook: str = "blocks.15.hook_resid_post"
    """TransformerLens hook point."""
    text_column: str | None = None
    """Text column of a table/JSONL dataset."""
    context_size: int = 128
    """Tokens per sequence."""
    training_tokens: int = 1_000_000
    """Activations (tokens) to train on."""
    batch_size: int = 512
    """Activations per training step (the minibatch of the entropy term)."""
    preset: Literal["default", "short_run", "paper"] = "default"
    """Training recipe (sae_lens_bae.saes.bae_presets); the options below replace its values."""
    lr: float | None = None
    """Adam learning rate (default: the recipe's)."""
    d_sae: int | None = None
    """Features (default: 4 x d_in)."""
    bits: int = 1
    """Bits per feature (more-bit decoding)."""
    entropy_coefficient: float | None = None
    """a_e, weight of the minibatch entropy in bits (default: the recipe's, for this d_in)."""
    covariance_coefficient: float | None = None
    """a_c, weight of the off-diagonal covariance penalty (default: the recipe's)."""
    surrogate: Literal["sigmoid", "ste"] = "sigmoid"
    """Surrogate derivative of the step."""
    surrogate_temperature: float | None = None
    """Temperature of the sigmoid surrogate (default: the recipe's)."""
    normalize_activations: Normalisation = "none"
    """SAELens' activation normalisation."""
    wandb: bool = False
    """Log to Weights & Biases."""
    wandb_project: str = "sae-lens-bae"
    """Weights & Biases project."""
    device: str = "cpu"
    """Torch device."""
    seed: int = 42
    """Seed of SAELens' runner and of the activation mixing."""
    checkpoints: int = 10
    """Checkpoints written during training, under OUT/checkpoints."""
    resume: Path | None = None
    """Continue a killed run from its newest complete checkpoint (give its OUT folder or a
    checkpoint folder) with the same options; it ends with the weights of an uninterrupted run."""


class BAETrainingRunner(LanguageModelSAETrainingRunner):
    """SAELens' runner, resumable exactly: the training stream comes from a
    ``ResumableActivationsStore`` (the evaluator keeps SAELens' own store, so evaluations never
    move the training stream), each checkpoint is marked complete once written, and a resumed
    trainer counts its steps from the checkpoint's marker (SAETrainer saves inside a step)."""

    def __init__(self, cfg: LanguageModelSAERunnerConfig[Any], **overrides: Any) -> None:
        if cfg.prefetch_llm_batches:
            raise ValueError("prefetch_llm_batches reads ahead of the checkpoints: turn it off "
                             "to train with BAETrainingRunner")  # fmt: skip
        super().__init__(cfg, **overrides)
        self.activations_store = ResumableActivationsStore.for_runner(
            self.model, cfg, override_dataset=overrides.get("override_dataset")
        )

    def run_trainer_with_interruption_handling(self, trainer: SAETrainer[Any, Any]) -> Any:
        saved = trainer.save_checkpoint_fn

        def save_and_mark(checkpoint_path: Path | None) -> None:
            if saved is not None:
                saved(checkpoint_path=checkpoint_path)
            if checkpoint_path is not None:
                mark_complete(checkpoint_path, n_training_samples=trainer.n_training_samples,
                              n_training_steps=trainer.n_training_steps + 1)  # fmt: skip

        trainer.save_checkpoint_fn = save_and_mark
        if self.cfg.resume_from_checkpoint is not None:
            trainer.n_training_steps = int(
                read_marker(self.cfg.resume_from_checkpoint)["n_training_steps"]
            )
            trainer.checkpoint_thresholds = [
                threshold for threshold in trainer.checkpoint_thresholds
                if threshold >= trainer.n_training_samples
            ]  # fmt: skip
        return super().run_trainer_with_interruption_handling(trainer)


def _check_resumable(checkpoint: Path, sae_cfg: Any) -> None:
    """Refuse a checkpoint of another model with one line (not a state-dict size mismatch)."""
    saved = json.loads((checkpoint / "cfg.json").read_text())
    wanted = sae_cfg.to_dict()
    differs = [key for key in ("architecture", "d_in", "d_sae", "bits")
               if saved.get(key) != wanted.get(key)]  # fmt: skip
    if differs:
        key = differs[0]
        raise ValueError(
            f"{checkpoint} holds a {key}={saved.get(key)} model, these options make "
            f"{key}={wanted.get(key)}: resume with the options of the interrupted run"
        )


def train_live(cfg: LiveTrainingConfig, progress: bool = True) -> Path:  # noqa: ARG001
    """Train with SAELens' runner (its own progress bar); returns the folder of the saved BAE."""
    model = load_model(cfg.model, device=cfg.device)
    check_hooks(model, [cfg.hook])
    tokens = load_token_dataset(cfg.dataset, model.tokenizer, cfg.context_size,
                                text_column=cfg.text_column)  # fmt: skip
    with torch.no_grad():
        _, cache = model.run_with_cache(
            token_rows(tokens.select(range(1))), names_filter=cfg.hook, prepend_bos=False
        )
    d_in = cache[cfg.hook].shape[-1]
    out = Path(cfg.out)
    chosen = {
        name: getattr(cfg, name)
        for name in ("entropy_coefficient", "covariance_coefficient", "surrogate_temperature")
        if getattr(cfg, name) is not None
    }
    sae_cfg = bae_config(d_in, cfg.d_sae, preset=cfg.preset, bits=cfg.bits,
                         surrogate=cfg.surrogate, normalize_activations=cfg.normalize_activations,
                         **chosen)  # fmt: skip
    runner_cfg = LanguageModelSAERunnerConfig(
        sae=sae_cfg,
        model_name=str(cfg.model),
        hook_name=cfg.hook,
        dataset_path="",
        is_dataset_tokenized=True,
        streaming=False,
        context_size=cfg.context_size,
        prepend_bos=False,  # the rows already start with BOS (see sae_lens_bae.data)
        training_tokens=cfg.training_tokens,
        train_batch_size_tokens=cfg.batch_size,
        lr=cfg.lr or BAE_PRESETS[cfg.preset].lr,
        device=cfg.device,
        seed=cfg.seed,
        logger=LoggingConfig(log_to_wandb=cfg.wandb, wandb_project=cfg.wandb_project),
        output_path=str(out),
        checkpoint_path=str(out / "checkpoints"),
        n_checkpoints=cfg.checkpoints,
    )
    if cfg.resume is not None:
        checkpoint = latest_checkpoint(cfg.resume)
        _check_resumable(checkpoint, sae_cfg)
        runner_cfg.resume_from_checkpoint = str(checkpoint)
        print(f"Resuming from {checkpoint}")
    fill_training_schedule(runner_cfg)
    with torch.random.fork_rng():  # the BAE's initial weights follow the seed
        torch.manual_seed(cfg.seed)
        runner = BAETrainingRunner(runner_cfg, override_dataset=tokens, override_model=model)
    runner.run()
    print(f"BAE saved to {out} (load with SAE.load_from_disk after `import sae_lens_bae`)")
    return out
