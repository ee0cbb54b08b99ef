"""``bae train``: a BAE trained live on a model's hook point with SAELens' training runner.

Activations come from the model's forward passes as training goes (SAELens'
``LanguageModelSAETrainingRunner``), never from a cache: the route for long runs on large corpora.
``BAETrainingRunner`` is that runner with an exactly resumable activation store
(``ResumableActivationsStore``) and checkpoints marked complete when written: ``bae train
--resume PATH`` continues a killed run on the minibatches it would have seen.
"""

from __future__ import annotations

import logging
import os
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from sae_lens import LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner, LoggingConfig
from sae_lens import logger as sae_lens_logger
from sae_lens.saes.sae import SAEConfig
from sae_lens.training.sae_trainer import SAETrainer

from sae_lens_bae.activations.hooks import hook_point, hook_width
from sae_lens_bae.activations.store import ResumableActivationsStore
from sae_lens_bae.checks import check_ranges, ranged
from sae_lens_bae.data import iter_texts, tokenize_texts
from sae_lens_bae.models import load_model
from sae_lens_bae.outliers import NORM_RATIO, outliers_set_aside, report_outliers
from sae_lens_bae.parallel.distributed import data_parallel, is_distributed, rank_world
from sae_lens_bae.saes.bae import BAETrainingSAEConfig
from sae_lens_bae.saes.bae_recipes import BAE_RECIPES, RecipeName, bae_config
from sae_lens_bae.training.checkpoints import (
    check_checkpoint_files,
    check_resumable,
    latest_checkpoint,
    mark_complete,
    read_marker,
)
from sae_lens_bae.training.trainer import NORM_ESTIMATE_BATCHES

__all__ = ["BAETrainingRunner", "LiveTrainingConfig", "train_live"]

Normalisation = typing.get_type_hints(SAEConfig)["normalize_activations"]
"""SAELens' activation normalisations (``none``, ``expected_average_only_in``, ...)."""


CompileMode = Literal["reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
"""torch.compile's modes besides its default."""


@dataclass
class LiveTrainingConfig:
    """What ``bae train`` runs: one BAE on one hook point, trained on live activations."""

    out: Path
    """Folder for the trained BAE (SAELens format); checkpoints go to OUT/checkpoints."""
    dataset: str
    """Text file, folder of files, or HF dataset name."""
    model: str = "smollm2-135m"
    """Embedded name, local HF directory or TransformerLens name."""
    hook: str = "hook_resid_post"
    """Hook point: a full TransformerLens name, or a name inside block --layer."""
    layer: int | None = ranged(None, low=0)
    """Block of a --hook inside a block (default: the middle one)."""
    text_column: str | None = None
    """Text column of a table/JSONL dataset."""
    context_size: int = ranged(128, low=1)
    """Tokens per sequence."""
    training_tokens: int = ranged(1_000_000, low=1)
    """Activations (tokens) to train on."""
    batch_size: int = ranged(512, low=1)
    """Activations per training step (the minibatch of the entropy term)."""
    recipe: RecipeName = "default"
    """Training recipe (sae_lens_bae.saes.bae_recipes); the options below replace its values."""
    lr: float | None = ranged(None, above=0.0)
    """Adam learning rate (default: the recipe's)."""
    expansion: int = ranged(4, low=1)
    """d_sae / d_in."""
    bits_per_feature: int = ranged(1, low=1)
    """Bits per feature (more-bit decoding)."""
    entropy_coefficient: float | None = ranged(None, low=0.0)
    """a_e, weight of the minibatch entropy in bits, at the recipe's coefficient width (the
    objective weighs it by width / d_in; default: the recipe's)."""
    covariance_coefficient: float | None = ranged(None, low=0.0)
    """a_c, weight of the off-diagonal covariance penalty, likewise (default: the recipe's)."""
    surrogate_temperature: float | None = ranged(None, above=0.0)
    """Temperature of the step's sigmoid surrogate derivative (default: the recipe's)."""
    normalize_activations: Normalisation = "expected_average_only_in"
    """SAELens' activation normalisation: by default states are scaled to mean norm sqrt(d_in)
    (estimated over NORM_ESTIMATE_BATCHES batches, folded into the saved weights), the scale the
    coefficients assume; it replaces a recipe's input frame, which "none" keeps."""
    outlier_norm_ratio: float | None = ranged(NORM_RATIO, above=1.0)
    """Each minibatch's extreme states (norm above this times its median; sae_lens_bae.outliers)
    are replaced by its median state and counted; none keeps them. BOS, EOS and padding states
    are always left out (SAELens' exclude_special_tokens)."""
    wandb: bool = False
    """Log to Weights & Biases."""
    wandb_project: str = "sae-lens-bae"
    """Weights & Biases project."""
    device: str = "cpu"
    """Torch device."""
    seed: int = 42
    """Seed of SAELens' runner and of the activation mixing."""
    checkpoints: int = ranged(10, low=0)
    """Checkpoints written during training, under OUT/checkpoints."""
    resume: Path | None = None
    """Continue a killed run from its newest complete checkpoint (give its OUT folder or a
    checkpoint folder) with the same options; it ends with the weights of an uninterrupted run."""
    distributed: bool = False
    """This process is one rank of a torchrun launch: every rank reads its shard of the dataset,
    --batch-size is the global minibatch (split over the ranks), the BAE's loss is the global
    batch's (sae_lens_bae.parallel.distributed). NCCL on CUDA (a GPU per local rank), else gloo."""
    compile: bool = False
    """Compile the BAE's training step with torch.compile (SAELens' compile_sae): a small BAE's
    step on a GPU costs its kernel launches, which the compiled step fuses; the first steps pay
    the compilation (seconds to a minute). Not with --distributed."""
    compile_mode: CompileMode | None = None
    """torch.compile's mode for the step (SAELens' sae_compilation_mode; implies --compile):
    reduce-overhead replays the step as a CUDA graph, one launch for a step whose cost on a GPU
    is the host's launching of its kernels (a BAE of d_sae 2304); None: torch's default."""

    @property
    def compiles(self) -> bool:
        """Whether the step is compiled: --compile, or a --compile-mode."""
        return self.compile or self.compile_mode is not None

    def __post_init__(self) -> None:
        check_ranges(self)


class BAETrainingRunner(LanguageModelSAETrainingRunner):
    """SAELens' runner, resumable exactly: the training stream comes from a
    ``ResumableActivationsStore`` (the evaluator keeps SAELens' own store, so evaluations never
    move the training stream), each checkpoint is marked complete once written, and a resumed
    trainer counts its steps from the checkpoint's marker (SAETrainer saves inside a step)."""

    def __init__(
        self, cfg: LanguageModelSAERunnerConfig[Any], distributed: bool = False, **overrides: Any
    ) -> None:
        if cfg.prefetch_llm_batches:
            raise ValueError(
                "prefetch_llm_batches reads ahead of the checkpoints: turn it off "
                "to train with BAETrainingRunner"
            )
        super().__init__(cfg, **overrides)
        self.rank, self.world = rank_world() if distributed else (0, 1)
        self.activations_store = ResumableActivationsStore.for_runner(
            self.model,
            cfg,
            override_dataset=overrides.get("override_dataset"),
            rank=self.rank,
            world=self.world,
        )

    def run_trainer_with_interruption_handling(self, trainer: SAETrainer[Any, Any]) -> Any:
        saved = trainer.save_checkpoint_fn

        def save_and_mark(checkpoint_path: Path | None) -> None:
            if saved is not None:
                saved(checkpoint_path=checkpoint_path)
            if checkpoint_path is not None:
                if self.world > 1:  # every rank's store state is written
                    dist.barrier()
                mark_complete(
                    checkpoint_path,
                    n_training_samples=trainer.n_training_samples,
                    n_training_steps=trainer.n_training_steps + 1,
                    world_size=self.world,
                )

        trainer.save_checkpoint_fn = save_and_mark
        if self.world > 1:
            _save_rank_state(self, trainer)
            data_parallel(trainer)
        if self.cfg.resume_from_checkpoint is not None:
            trainer.n_training_steps = int(
                read_marker(self.cfg.resume_from_checkpoint)["n_training_steps"]
            )
            trainer.checkpoint_thresholds = [
                threshold
                for threshold in trainer.checkpoint_thresholds
                if threshold >= trainer.n_training_samples
            ]
        return super().run_trainer_with_interruption_handling(trainer)


def _save_rank_state(runner: BAETrainingRunner, trainer: SAETrainer[Any, Any]) -> None:
    """Ranks other than 0 write only their activation store's state (their stream position) into
    CHECKPOINT/rank_R; rank 0 writes the rest and marks the checkpoint once every rank is done."""
    if runner.rank == 0:
        return

    def save_checkpoint(checkpoint_name: str, *_: Any, **__: Any) -> None:
        if runner.cfg.checkpoint_path is not None:  # as rank 0, which then waits for this one
            runner.activations_store.save_to_checkpoint(
                Path(runner.cfg.checkpoint_path) / checkpoint_name
            )
            dist.barrier()

    trainer.save_checkpoint = save_checkpoint


def train_live(cfg: LiveTrainingConfig, progress: bool = True) -> Path:  # noqa: ARG001
    """Train with SAELens' runner (its own progress bar); returns the folder of the saved BAE."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and not cfg.distributed:
        raise ValueError(
            f"torchrun started {launched} processes: add --distributed to train one BAE on all "
            "of them (without it every process would train its own copy into the same folder)"
        )
    if cfg.compiles and cfg.distributed:
        raise ValueError(
            "--compile does not combine with --distributed (the data-parallel step replaces the "
            "compiled one): drop one of them"
        )
    started_group = cfg.distributed and not is_distributed()
    if started_group and "MASTER_ADDR" not in os.environ:
        raise ValueError(
            "--distributed runs as one of the processes torchrun starts: "
            "torchrun --nproc_per_node N -m sae_lens_bae train --distributed ..."
        )
    device = cfg.device
    if started_group:
        if device.startswith("cuda"):
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    try:
        return _train_live(cfg, device)
    finally:
        if started_group:
            dist.destroy_process_group()


def _train_live(cfg: LiveTrainingConfig, device: str) -> Path:
    rank, world = rank_world() if cfg.distributed else (0, 1)
    texts = iter_texts(cfg.dataset, text_column=cfg.text_column)  # a missing path fails first
    model = load_model(cfg.model, device=device)
    hook = hook_point(model, cfg.hook, cfg.layer)
    tokens = tokenize_texts(texts, model.tokenizer, cfg.context_size)
    d_in = hook_width(model, hook)
    if world > 1:  # every rank reads its own contiguous shard of the sequences
        tokens = tokens.shard(num_shards=world, index=rank, contiguous=True)
    out = Path(cfg.out)
    sae_cfg = _sae_config(cfg, d_in)
    runner_cfg = _runner_config(cfg, sae_cfg, hook, device, rank)
    if world > 1:  # SAELens appends a random run id: take rank 0's
        shared = [runner_cfg.checkpoint_path]
        dist.broadcast_object_list(shared, src=0)
        runner_cfg.checkpoint_path = shared[0]
    if cfg.resume is not None:
        checkpoint = latest_checkpoint(cfg.resume)
        check_resumable(
            checkpoint,
            {"world_size": world},
            rank_streams="a live run resumes on the ranks' own activation streams",
            model=sae_cfg.to_dict(),
        )
        check_checkpoint_files(checkpoint)
        runner_cfg.resume_from_checkpoint = str(checkpoint)
        if rank == 0:
            print(f"Resuming from {checkpoint}")
    with torch.random.fork_rng(), _overrides_set_on_purpose():
        torch.manual_seed(cfg.seed)  # the BAE's initial weights follow the seed
        runner = BAETrainingRunner(
            runner_cfg, distributed=cfg.distributed, override_dataset=tokens, override_model=model
        )
    sae = runner.run()
    if rank == 0:  # every rank counts the rows of the global minibatches: one report
        total, ratio = cfg.training_tokens, cfg.outlier_norm_ratio
        report_outliers(outliers_set_aside(sae), total, "training steps", ratio)
        print(f"BAE saved to {out} (load with SAE.load_from_disk after `import sae_lens_bae`)")
    return out


def _sae_config(cfg: LiveTrainingConfig, d_in: int) -> BAETrainingSAEConfig:
    """The BAE ``cfg`` trains: its recipe with the options given on purpose, its phases in steps
    of the run (SAELens' ``training_tokens // train_batch_size_tokens``); SAELens'
    normalisation, when asked for, in place of the BAE's input frame (one scaling of the inputs)."""
    chosen = {
        name: getattr(cfg, name)
        for name in ("entropy_coefficient", "covariance_coefficient", "surrogate_temperature")
        if getattr(cfg, name) is not None
    }
    if cfg.normalize_activations != "none":
        chosen["input_variance"] = None
    elif BAE_RECIPES[cfg.recipe].input_total_variance is not None:
        raise ValueError(
            f"The {cfg.recipe} recipe frames its inputs on the training set before the first step, "
            "which a stream from the model does not give: keep --normalize-activations "
            "expected_average_only_in, or harvest the states and train them with train_sae"
        )
    return bae_config(
        d_in,
        cfg.expansion * d_in,
        recipe=cfg.recipe,
        training_steps=cfg.training_tokens // cfg.batch_size,
        bits_per_feature=cfg.bits_per_feature,
        normalize_activations=cfg.normalize_activations,
        extreme_norm_ratio=cfg.outlier_norm_ratio,  # the ratio the BAE's step screens with
        **chosen,
    )


def _runner_config(
    cfg: LiveTrainingConfig, sae_cfg: Any, hook: str, device: str, rank: int
) -> LanguageModelSAERunnerConfig[Any]:
    """SAELens' runner config of this run: the tokenised rows and the loaded model come as the
    runner's overrides, so its dataset and model fields only name them."""
    out = Path(cfg.out)
    return LanguageModelSAERunnerConfig(
        sae=sae_cfg,
        model_name=str(cfg.model),
        hook_name=hook,
        dataset_path="",
        is_dataset_tokenized=True,
        streaming=False,
        context_size=cfg.context_size,
        prepend_bos=False,  # the rows already start with BOS (see sae_lens_bae.data)
        exclude_special_tokens=True,  # BOS (an attention sink in many models), EOS, padding
        training_tokens=cfg.training_tokens,
        train_batch_size_tokens=cfg.batch_size,
        n_batches_for_norm_estimate=NORM_ESTIMATE_BATCHES,
        lr=cfg.lr or BAE_RECIPES[cfg.recipe].lr,
        device=device,
        seed=cfg.seed,
        logger=LoggingConfig(log_to_wandb=cfg.wandb and rank == 0, wandb_project=cfg.wandb_project),
        output_path=str(out) if rank == 0 else None,  # rank 0 saves the BAE
        checkpoint_path=str(out / "checkpoints"),
        n_checkpoints=cfg.checkpoints,
        compile_sae=cfg.compiles,
        sae_compilation_mode=cfg.compile_mode,
    )


class _NotReproducibleNote(logging.Filter):
    """Drops SAELens' warning that an ``override_dataset`` / ``override_model`` makes a run "not
    reproducible via configuration alone": ``bae train`` passes both on purpose, built from its
    own config (``--dataset``, ``--model``), which the saved run records; the warning would only
    repeat on every run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "not be reproducible via configuration alone" not in record.getMessage()


@contextmanager
def _overrides_set_on_purpose() -> Iterator[None]:
    """SAELens' runner built without its override warnings (``_NotReproducibleNote``)."""
    note = _NotReproducibleNote()
    sae_lens_logger.addFilter(note)
    try:
        yield
    finally:
        sae_lens_logger.removeFilter(note)
