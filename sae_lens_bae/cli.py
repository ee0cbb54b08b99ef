"""The ``bae`` command line: ``bae quickstart`` and ``bae train``."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    help="Binary Autoencoders (BAE) on TransformerLens models, trained with SAELens.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def quickstart(
    out: Path = typer.Option(Path("runs/quickstart"), help="Report folder."),
    model: str = typer.Option("smollm2-135m", help="Embedded name, HF directory or TL name."),
    layer: int | None = typer.Option(None, help="Layer whose hook_resid_post is used."),
    corpus: str | None = typer.Option(None, help="Text file/folder/HF dataset."),
    text_column: str | None = typer.Option(None, help="Text column of a table/JSONL corpus."),
    steps: int = typer.Option(1000, help="Training steps per model."),
    context_size: int = typer.Option(128),
    max_sequences: int | None = typer.Option(None, help="Cap on harvested sequences."),
    device: str = typer.Option("cpu"),
) -> None:
    """Train a BAE and a topk SAE on SmolLM2-135M's middle layer and write a report."""
    from sae_lens_bae.quickstart import QuickstartConfig, run_quickstart

    run_quickstart(
        QuickstartConfig(
            out=out,
            model=model,
            layer=layer,
            corpus=corpus,
            text_column=text_column,
            steps=steps,
            context_size=context_size,
            max_sequences=max_sequences,
            device=device,
        )
    )


@app.command()
def train(
    out: Path = typer.Option(..., help="Folder for the trained BAE (SAELens format)."),
    dataset: str = typer.Option(..., help="Text file, folder of files, or HF dataset name."),
    model: str = typer.Option("smollm2-135m", help="Embedded name, HF directory or TL name."),
    hook: str = typer.Option("blocks.15.hook_resid_post", help="TransformerLens hook point."),
    text_column: str | None = typer.Option(None),
    context_size: int = typer.Option(128),
    training_tokens: int = typer.Option(1_000_000),
    batch_size: int = typer.Option(512),
    lr: float = typer.Option(5e-4),
    d_sae: int | None = typer.Option(None, help="Features; default 4 x d_in."),
    bits: int = typer.Option(1, help="Bits per feature (more-bit decoding)."),
    entropy_coefficient: float = typer.Option(1e-7),
    covariance_coefficient: float = typer.Option(1e-7),
    surrogate: str = typer.Option("sigmoid", help="sigmoid or ste."),
    surrogate_temperature: float = typer.Option(1.0),
    normalize_activations: str = typer.Option("none", help="none or expected_average_only_in."),
    wandb: bool = typer.Option(False, help="Log to Weights & Biases."),
    wandb_project: str = typer.Option("sae-lens-bae"),
    device: str = typer.Option("cpu"),
    seed: int = typer.Option(42),
) -> None:
    """Train a BAE live from a model's hook with SAELens' LanguageModelSAETrainingRunner."""
    import torch
    from sae_lens import LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner, LoggingConfig

    from sae_lens_bae.activations import check_hooks
    from sae_lens_bae.data import load_token_dataset
    from sae_lens_bae.models import load_model
    from sae_lens_bae.saes.bae import BAETrainingSAEConfig
    from sae_lens_bae.training import fill_training_schedule

    lm = load_model(model, device=device)
    check_hooks(lm, [hook])
    tokens = load_token_dataset(dataset, lm.tokenizer, context_size, text_column=text_column)
    with torch.no_grad():
        _, cache = lm.run_with_cache(
            torch.as_tensor(tokens[:1]["input_ids"]), names_filter=hook, prepend_bos=False
        )
    d_in = cache[hook].shape[-1]
    cfg = LanguageModelSAERunnerConfig(
        sae=BAETrainingSAEConfig(
            d_in=d_in,
            d_sae=d_sae,
            bits=bits,
            entropy_coefficient=entropy_coefficient,
            covariance_coefficient=covariance_coefficient,
            surrogate=surrogate,  # type: ignore[arg-type]
            surrogate_temperature=surrogate_temperature,
            normalize_activations=normalize_activations,  # type: ignore[arg-type]
        ),
        model_name=str(model),
        hook_name=hook,
        dataset_path="",
        is_dataset_tokenized=True,
        streaming=False,
        context_size=context_size,
        prepend_bos=False,  # the rows already start with BOS (see sae_lens_bae.data)
        training_tokens=training_tokens,
        train_batch_size_tokens=batch_size,
        lr=lr,
        device=device,
        seed=seed,
        logger=LoggingConfig(log_to_wandb=wandb, wandb_project=wandb_project),
        output_path=str(out),
        checkpoint_path=str(out / "checkpoints"),
    )
    fill_training_schedule(cfg)
    LanguageModelSAETrainingRunner(cfg, override_dataset=tokens, override_model=lm).run()
    typer.echo(f"BAE saved to {out} (load with SAE.load_from_disk after `import sae_lens_bae`)")


bench_app = typer.Typer(help="Benchmarks with known answers.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("synthetic")
def bench_synthetic(
    preset: str = typer.Option("cpu", help="cpu (2-core machine), paper (GPU) or test."),
    out: Path = typer.Option(Path("runs/synthetic"), help="Folder for JSON, table and plots."),
    steps: int | None = typer.Option(None, help="Override the preset's training steps."),
) -> None:
    """Estimate the entropy of data with exactly r bits, with and without the BAE objective."""
    from dataclasses import replace

    from sae_lens_bae.entropy.synthetic import PRESETS, passes_bar, run_synthetic

    if preset not in PRESETS:
        raise typer.BadParameter(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    chosen = PRESETS[preset] if steps is None else replace(PRESETS[preset], steps=steps)
    rows = run_synthetic(chosen, out)
    verdict = passes_bar(rows, min_seeds=min(2, len(chosen.seeds)))
    typer.echo((out / "synthetic.md").read_text())
    typer.echo(f"objective bar met: {verdict['objective_ok']}, ablation: {verdict['ablation_ok']}")
    typer.echo(f"results in {out}/")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
