"""The ``bae`` command line: quickstart, train, entropy tracing and benchmarks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from sae_lens_bae.entropy.cells import TRACING_RECIPE
from sae_lens_bae.features.compare import BASELINES

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


@app.command()
def compare(
    dataset: str | None = typer.Option(None, help="Text file/folder/HF dataset; default embedded."),
    model: str = typer.Option("smollm2-135m", help="Embedded name, HF directory or TL name."),
    layer: int | None = typer.Option(None, help="Layer (default: the middle one)."),
    text_column: str | None = typer.Option(None),
    baselines: str = typer.Option(",".join(BASELINES), help="Comma-separated baselines."),
    context_size: int = typer.Option(128),
    max_sequences: int | None = typer.Option(1536, help="Cap on harvested sequences."),
    expansion: int = typer.Option(4, help="d_sae / d_in of every model."),
    steps: int = typer.Option(2000, help="Training steps of every model."),
    prior: str = typer.Option("training", help="BAE burstiness prior: training or evaluation."),
    records_k: int = typer.Option(10, help="Top-k features kept per token."),
    dense_threshold: float = typer.Option(0.5),
    device: str = typer.Option("cpu"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("runs/compare"), help="Report folder."),
    comsem_llm: str | None = typer.Option(None, help="Add ComSem columns, judged by this LLM."),
    comsem_base_url: str | None = typer.Option(None, help="Its OpenAI-compatible endpoint."),
    comsem_max_features: int | None = typer.Option(None, help="ComSem on the first N features."),
) -> None:
    """Train a BAE and SAELens' SAEs on one layer's activations; compare their features."""
    from sae_lens_bae.features.compare import CompareConfig, run_compare

    llm = _comsem_client(comsem_llm, comsem_base_url)

    run_compare(
        CompareConfig(
            dataset=dataset,
            model=model,
            layer=layer,
            text_column=text_column,
            baselines=_csv(baselines, str, "--baselines"),
            context_size=context_size,
            max_sequences=max_sequences,
            expansion=expansion,
            steps=steps,
            prior=prior,  # type: ignore[arg-type]
            records_k=records_k,
            dense_threshold=dense_threshold,
            device=device,
            seed=seed,
            out=out,
            comsem=llm,
            comsem_max_features=comsem_max_features,
        )
    )
    typer.echo((out / "compare.md").read_text())
    typer.echo(f"results in {out}/")


@app.command()
def interpret(
    records: Path | None = typer.Option(None, help="Records file (bae compare writes them)."),
    sae: Path | None = typer.Option(None, help="Or a saved SAE/BAE folder, read on --dataset."),
    dataset: str | None = typer.Option(None, help="With --sae: text file/folder/HF dataset."),
    hook: str | None = typer.Option(None, help="With --sae: hook point (default: the SAE's)."),
    sentences: int = typer.Option(8192, help="With --sae: evaluation rows (N)."),
    context_size: int = typer.Option(64, help="With --sae: tokens per row."),
    k: int = typer.Option(10, help="With --sae: top-k features kept per token."),
    magnitude: str | None = typer.Option(None, help="With --sae: burstiness, raw or rescaled."),
    input_scale: float = typer.Option(1.0, help="With --sae: its training activations' scale."),
    base_url: str | None = typer.Option(
        None, help="OpenAI-compatible endpoint (vLLM, Ollama, llama.cpp server); default OpenAI."
    ),
    llm: str = typer.Option("gpt-4o-mini", help="Model name the server serves."),
    api_key: str | None = typer.Option(
        None, help="Default: $OPENAI_API_KEY (local servers need none)."
    ),
    model: str | None = typer.Option(
        None, help="LM whose tokenizer reads the records; default: the one recorded in them."
    ),
    out: Path = typer.Option(
        Path("runs/interpret"), help="Report folder (also holds the reply cache)."
    ),
    cache: Path | None = typer.Option(
        None, help="Reply cache (sqlite); default OUT/replies.sqlite."
    ),
    concurrency: int = typer.Option(16, help="Requests in flight at once."),
    max_features: int | None = typer.Option(
        None, help="Evaluate only the first N activated features."
    ),
    n_explain: int = typer.Option(5, help="Records shown to the explainer (n_I)."),
    n_test: int = typer.Option(8, help="Records judged per feature (n_T)."),
    detection: bool = typer.Option(
        False, help="Also judge as many non-activating records; balanced accuracy."
    ),
    calibrate: bool = typer.Option(
        False, help="Calibrate the judge on a content-free input (needs logprobs)."
    ),
    batch_api: bool = typer.Option(False, help="Use the OpenAI Batch API (half price, slower)."),
    price_input: float = typer.Option(
        0.0, help="USD per million prompt tokens, for the cost report."
    ),
    price_output: float = typer.Option(0.0, help="USD per million completion tokens."),
    templates: Path | None = typer.Option(
        None, help="Folder with explain.json/judge.json overrides."
    ),
    top: int = typer.Option(20, help="Rows of the top-features table."),
) -> None:
    """ComSem: ask an LLM what each feature's tokens have in common, then judge held-out tokens."""
    from sae_lens_bae.comsem import ClientConfig, ComSemConfig, comsem
    from sae_lens_bae.features.records import FeatureRecords
    from sae_lens_bae.models import load_tokenizer

    if (records is None) == (sae is None):
        raise typer.BadParameter("pass either --records FILE or --sae FOLDER (with --dataset)")
    if records is not None:
        if not records.exists():
            raise typer.BadParameter(f"no records file {records}; `bae compare` writes them")
        loaded = FeatureRecords.load(records)
    else:
        loaded = _records_from_sae(
            sae, dataset, model, hook, sentences, context_size, k, magnitude, input_scale, out
        )
    source = model or loaded.info.get("model")
    if source is None:
        raise typer.BadParameter("these records do not say which model made them: pass --model")
    client = ClientConfig(
        model=llm,
        base_url=base_url,
        api_key=api_key,
        concurrency=concurrency,
        price_input=price_input,
        price_output=price_output,
        batch_api=batch_api,
    )
    config = ComSemConfig(
        n_explain=n_explain,
        n_test=n_test,
        detection=detection,
        calibrate=calibrate,
        max_features=max_features,
        top=top,
        templates=templates,
    )
    comsem(loaded, load_tokenizer(source), client, config, out=out, cache=cache)
    typer.echo((out / "summary.md").read_text())
    typer.echo(f"results in {out}/")


def _records_from_sae(
    sae_dir: Path,
    dataset: str | None,
    model: str | None,
    hook: str | None,
    sentences: int,
    context_size: int,
    k: int,
    magnitude: str | None,
    input_scale: float,
    out: Path,
) -> Any:
    """ComSem's records made from a saved SAE over --dataset (saved to OUT/records.safetensors)."""
    from sae_lens import SAE

    from sae_lens_bae.activations import check_hooks
    from sae_lens_bae.data import load_token_dataset
    from sae_lens_bae.features.records import records_from_text
    from sae_lens_bae.models import load_model

    if dataset is None:
        raise typer.BadParameter("--sae needs --dataset (the text whose tokens are interpreted)")
    if magnitude not in (None, "burstiness", "raw", "rescaled"):
        raise typer.BadParameter(f"--magnitude {magnitude!r}: burstiness, raw or rescaled")
    loaded_sae = SAE.load_from_disk(sae_dir)
    hook = hook or loaded_sae.cfg.metadata.hook_name
    name = model or loaded_sae.cfg.metadata.model_name or "smollm2-135m"
    if hook is None:
        raise typer.BadParameter("this SAE does not name its hook point: pass --hook")
    lm = load_model(name)
    check_hooks(lm, [hook])
    tokens = load_token_dataset(dataset, lm.tokenizer, context_size, max_sequences=sentences)
    records = records_from_text(
        lm, loaded_sae, tokens, hook, out / "activations", k=k,
        magnitude=magnitude, input_scale=input_scale,  # type: ignore[arg-type]
    )  # fmt: skip
    records.info["model"] = name
    out.mkdir(parents=True, exist_ok=True)
    records.save(out / "records.safetensors")
    return records


bench_app = typer.Typer(help="Benchmarks with known answers.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("synthetic")
def bench_synthetic(
    preset: str = typer.Option("cpu", help="cpu (2-core machine), paper (GPU) or test."),
    out: Path = typer.Option(Path("runs/synthetic"), help="Folder for JSON, table and plots."),
    steps: int | None = typer.Option(None, help="Override the preset's training steps."),
    ranks: str | None = typer.Option(None, help="Override the preset's ranks r, e.g. 0,8,64."),
    expansions: str | None = typer.Option(None, help="Override the expansion rates, e.g. 4."),
    seeds: str | None = typer.Option(None, help="Override the seeds, e.g. 0,1."),
    device: str = typer.Option("cpu", help="cpu or cuda (the paper preset wants a GPU)."),
) -> None:
    """Estimate the entropy of data with exactly r bits, with and without the BAE objective."""
    from sae_lens_bae.entropy.synthetic import PRESETS, passes_bar, run_synthetic

    if preset not in PRESETS:
        raise typer.BadParameter(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    chosen = PRESETS[preset]
    if steps is not None:
        chosen = replace(chosen, recipe=replace(chosen.recipe, steps=steps))
    overrides = {"ranks": ranks, "expansions": expansions, "seeds": seeds}
    for field_name, text in overrides.items():
        if text is not None:
            values = tuple(_csv(text, int, f"--{field_name}"))
            chosen = replace(chosen, **{field_name: values})
    if max(chosen.ranks) > chosen.d:
        raise typer.BadParameter(f"--ranks go up to d = {chosen.d} for preset {preset!r}")
    rows = run_synthetic(chosen, out, device=device)
    verdict = passes_bar(rows, min_seeds=min(2, len(chosen.seeds)))
    typer.echo((out / "synthetic.md").read_text())
    typer.echo(f"objective bar met: {verdict['objective_ok']}, ablation: {verdict['ablation_ok']}")
    typer.echo(f"results in {out}/")


@bench_app.command("two-token")
def bench_two_token(
    model: str = typer.Option("smollm2-135m", help="Embedded name, HF directory or TL name."),
    layer: int = typer.Option(15, help="Layer whose hook is read."),
    hook: str = typer.Option("hook_resid_post", help="Hook point inside each block."),
    words: str = typer.Option(
        "yes,no", help="The two words whose first tokens make the sequences."
    ),
    ranks: str = typer.Option("0,1,2,4,6,8,10,12", help="Sequence lengths r."),
    n_samples: int = typer.Option(4096, help="Sequences per r."),
    expansion: int = typer.Option(TRACING_RECIPE.expansion, help="d_sae / d_in of each BAE."),
    steps: int = typer.Option(TRACING_RECIPE.steps, help="Training steps of each BAE."),
    bae_batch_size: int = typer.Option(TRACING_RECIPE.batch_size, help="BAE minibatch."),
    lr: float = typer.Option(TRACING_RECIPE.lr, help="Adam learning rate of the BAEs."),
    device: str = typer.Option("cpu"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("runs/two_token"), help="Folder for JSON, table and plot."),
) -> None:
    """Entropy of hidden states after r random tokens from two: the estimate should stay <= r."""
    from sae_lens_bae.entropy.two_token import TwoTokenConfig, run_two_token

    pair = _csv(words, str, "--words")
    if len(pair) != 2:
        raise typer.BadParameter(f"--words needs exactly two words, got {pair}")
    rows = run_two_token(
        TwoTokenConfig(
            model=model,
            layer=layer,
            hook=hook,
            words=(pair[0], pair[1]),
            ranks=_csv(ranks, int, "--ranks"),
            n_samples=n_samples,
            recipe=replace(
                TRACING_RECIPE,
                expansion=expansion,
                steps=steps,
                batch_size=bae_batch_size,
                lr=lr,
            ),
            device=device,
            seed=seed,
            out=out,
        )
    )
    typer.echo((out / "two_token.md").read_text())
    typer.echo(f"every estimate within its ceiling: {all(r['within_ceiling'] for r in rows)}")
    typer.echo(f"results in {out}/")


@bench_app.command("more-bits")
def bench_more_bits(
    dataset: str | None = typer.Option(None, help="Text file/folder/HF dataset; default embedded."),
    model: str = typer.Option("smollm2-135m", help="Embedded name, HF directory or TL name."),
    layer: int | None = typer.Option(None, help="Layer (default: the middle one)."),
    bits: str = typer.Option("1,2,3,4", help="Code bits per feature C, one BAE each."),
    expansion: int = typer.Option(1, help="Decoder width d_sae / d_in, the same for every C."),
    steps: int = typer.Option(1000, help="Training steps per BAE."),
    max_sequences: int | None = typer.Option(512, help="Cap on harvested sequences."),
    context_size: int = typer.Option(128),
    comsem_llm: str | None = typer.Option(None, help="Add ComSem columns, judged by this LLM."),
    comsem_base_url: str | None = typer.Option(None, help="Its OpenAI-compatible endpoint."),
    comsem_max_features: int | None = typer.Option(None, help="ComSem on the first N features."),
    device: str = typer.Option("cpu"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("runs/more_bits"), help="Report folder."),
) -> None:
    """BAEs with C = 1..4 bits per feature at one decoder width: reconstruction vs features."""
    from sae_lens_bae.features.more_bits import MoreBitsConfig, run_more_bits

    run_more_bits(
        MoreBitsConfig(
            dataset=dataset,
            model=model,
            layer=layer,
            bits=_csv(bits, int, "--bits"),
            expansion=expansion,
            steps=steps,
            max_sequences=max_sequences,
            context_size=context_size,
            comsem=_comsem_client(comsem_llm, comsem_base_url),
            comsem_max_features=comsem_max_features,
            device=device,
            seed=seed,
            out=out,
        )
    )
    typer.echo((out / "more_bits.md").read_text())
    typer.echo(f"results in {out}/")


@app.command("compress")
def compress_states(
    dataset: str | None = typer.Option(None, help="Text file/folder/HF dataset; default embedded."),
    model: str = typer.Option("smollm2-135m", help="Embedded name, HF directory or TL name."),
    layer: int | None = typer.Option(None, help="Layer (default: the middle one)."),
    thresholds: str = typer.Option(
        "-1,-0.75,-0.5,-0.25,0", help="Burstiness thresholds in [-1, 0]."
    ),
    expansion: int = typer.Option(4),
    steps: int = typer.Option(1000, help="Training steps of the BAE."),
    max_sequences: int | None = typer.Option(512, help="Cap on harvested sequences."),
    context_size: int = typer.Option(128),
    device: str = typer.Option("cpu"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("runs/compress"), help="Report folder."),
) -> None:
    """Train a BAE on one layer and compress held-out hidden states to their surprising bits."""
    from sae_lens_bae.compression import CompressionConfig, run_compression

    values = tuple(_csv(thresholds, float, "--thresholds"))
    bad = [t for t in values if not -1.0 <= t <= 0.0]
    if bad:
        raise typer.BadParameter(f"--thresholds {bad} outside [log2 0.5, 0] = [-1, 0]")
    run_compression(
        CompressionConfig(
            dataset=dataset,
            model=model,
            layer=layer,
            thresholds=values,
            expansion=expansion,
            steps=steps,
            max_sequences=max_sequences,
            context_size=context_size,
            device=device,
            seed=seed,
            out=out,
        )
    )
    typer.echo((out / "compression.md").read_text())
    typer.echo(f"results in {out}/")


def _comsem_client(llm: str | None, base_url: str | None) -> Any:
    """The ComSem client config of --comsem-llm/--comsem-base-url, or None."""
    if llm is None:
        return None
    from sae_lens_bae.comsem import ClientConfig

    return ClientConfig(model=llm, base_url=base_url)


entropy_app = typer.Typer(help="Trace an LLM's hidden-state entropy.", no_args_is_help=True)
app.add_typer(entropy_app, name="entropy")


def _label_words(text: str | None) -> dict[str, str] | None:
    """--label-words '0=negative,1=positive' as a dict."""
    if not text:
        return None
    try:
        return dict(item.split("=", 1) for item in text.split(","))  # type: ignore[misc]
    except ValueError as e:
        raise typer.BadParameter(f"--label-words looks like '0=negative,1=positive': {e}") from e


def _csv(text: str, kind: type, option: str) -> list:
    try:
        return [kind(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError as e:
        raise typer.BadParameter(f"{option} takes comma-separated values: {e}") from e


@entropy_app.command("positions")
def entropy_positions(
    model: str = typer.Option("smollm2-135m", help="Embedded name, HF directory or TL name."),
    dataset: str | None = typer.Option(None, help="Text file/folder/HF dataset; default embedded."),
    text_column: str | None = typer.Option(None),
    layers: str = typer.Option("5,15,25", help="Comma-separated layers."),
    hook: str = typer.Option("hook_resid_post", help="Hook point inside each block."),
    max_log2_position: int = typer.Option(6, help="K: positions 2^0 .. 2^K."),
    n_sequences: int = typer.Option(2048, help="Document windows of 2^K tokens."),
    expansion: int = typer.Option(TRACING_RECIPE.expansion, help="d_sae / d_in of each BAE."),
    steps: int = typer.Option(TRACING_RECIPE.steps, help="Training steps of each BAE."),
    bae_batch_size: int = typer.Option(TRACING_RECIPE.batch_size, help="BAE minibatch."),
    lr: float = typer.Option(TRACING_RECIPE.lr, help="Adam learning rate of the BAEs."),
    batch_size: int = typer.Option(32, help="Sequences per forward pass."),
    device: str = typer.Option("cpu"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("runs/entropy_positions"), help="Folder for JSON and plot."),
) -> None:
    """Entropy per (layer, token position 2^j), one BAE per cell, all trained stacked."""
    from sae_lens_bae.entropy.positions import PositionTracingConfig, run_position_tracing

    run_position_tracing(
        PositionTracingConfig(
            model=model,
            dataset=dataset,
            text_column=text_column,
            layers=_csv(layers, int, "--layers"),
            hook=hook,
            max_log2_position=max_log2_position,
            n_sequences=n_sequences,
            recipe=replace(
                TRACING_RECIPE,
                expansion=expansion,
                steps=steps,
                batch_size=bae_batch_size,
                lr=lr,
            ),
            batch_size=batch_size,
            device=device,
            seed=seed,
            out=out,
        )
    )
    typer.echo((out / "positions.md").read_text())
    typer.echo(f"results in {out}/")


@entropy_app.command("icl")
def entropy_icl(
    dataset: str = typer.Option(..., help="Labelled sentences: TSV, folder (SST-2/MR), HF name."),
    model: str = typer.Option("smollm2-135m", help="Embedded name, HF directory or TL name."),
    split: str = typer.Option("train", help="Split file (<split>.tsv) or HF split."),
    text_column: str | None = typer.Option(None),
    label_column: str = typer.Option("label"),
    label_words: str | None = typer.Option(None, help="e.g. '0=terrible,1=great'."),
    layers: str = typer.Option("5,15,25", help="Comma-separated layers."),
    hook: str = typer.Option("hook_resid_post", help="Hook point inside each block."),
    shots: str = typer.Option("0,1,2,4,8", help="Numbers of demonstrations k."),
    n_prompts: int = typer.Option(512, help="Queries (the same for every k)."),
    max_sentence_words: int = typer.Option(24, help="Longer sentences are skipped; 0: keep all."),
    expansion: int = typer.Option(TRACING_RECIPE.expansion, help="d_sae / d_in of each BAE."),
    steps: int = typer.Option(TRACING_RECIPE.steps, help="Training steps of each BAE."),
    bae_batch_size: int = typer.Option(TRACING_RECIPE.batch_size, help="BAE minibatch."),
    lr: float = typer.Option(TRACING_RECIPE.lr, help="Adam learning rate of the BAEs."),
    batch_size: int = typer.Option(16, help="Prompts per forward pass."),
    device: str = typer.Option("cpu"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("runs/entropy_icl"), help="Folder for JSON and plot."),
) -> None:
    """Last-token entropy per (layer, k demonstrations), with the model's ICL accuracy per k."""
    from sae_lens_bae.entropy.icl import ICLTracingConfig, run_icl_tracing

    words = _label_words(label_words)
    run_icl_tracing(
        ICLTracingConfig(
            dataset=dataset,
            model=model,
            split=split,
            text_column=text_column,
            label_column=label_column,
            label_words=words,
            layers=_csv(layers, int, "--layers"),
            hook=hook,
            shots=_csv(shots, int, "--shots"),
            n_prompts=n_prompts,
            max_sentence_words=max_sentence_words or None,
            recipe=replace(
                TRACING_RECIPE,
                expansion=expansion,
                steps=steps,
                batch_size=bae_batch_size,
                lr=lr,
            ),
            batch_size=batch_size,
            device=device,
            seed=seed,
            out=out,
        )
    )
    typer.echo((out / "icl.md").read_text())
    typer.echo(f"results in {out}/")


steer_app = typer.Typer(help="Steer an LLM with task vectors from features.", no_args_is_help=True)
app.add_typer(steer_app, name="steer")


@steer_app.command("icl")
def steer_icl(
    dataset: str = typer.Option(..., help="Labelled sentences: TSV/CSV/JSONL, folder or HF name."),
    model: str = typer.Option("smollm2-135m", help="Embedded name, HF directory or TL name."),
    layer: int = typer.Option(15, help="Layer whose residual stream is steered."),
    hook: str = typer.Option("hook_resid_post", help="Hook point within the layer."),
    split: str = typer.Option("train"),
    text_column: str | None = typer.Option(None),
    label_column: str = typer.Option("label"),
    label_words: str | None = typer.Option(
        None, help="label=word pairs, e.g. 0=negative,1=positive."
    ),
    shots: int = typer.Option(8, help="Demonstrations in the positive prompts."),
    vector_prompts: int = typer.Option(128, help="Queries making the vectors (k-shot and 0-shot)."),
    eval_prompts: int = typer.Option(
        256, help="Held-out 0-shot queries the vectors are tested on."
    ),
    top: int = typer.Option(256, help="Features kept in each task vector."),
    baselines: str = typer.Option("standard,topk15", help="SAELens baselines (see bae compare)."),
    strengths: str = typer.Option("0.5,1,2,4,8", help="Steering strengths swept."),
    normalise: bool = typer.Option(True, help="Rescale vectors to the mean difference's norm."),
    steps: int = typer.Option(1000, help="Training steps of the BAE and each SAE."),
    expansion: int = typer.Option(4),
    device: str = typer.Option("cpu"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("runs/steer_icl"), help="Report folder."),
) -> None:
    """Task vectors from k-shot vs 0-shot states, added to held-out 0-shot prompts."""
    from sae_lens_bae.steering.icl import SteerICLConfig, run_steer_icl

    names = _csv(baselines, str, "--baselines")
    unknown = [b for b in names if b not in BASELINES or b in ("transcoder", "standard_rescaled")]
    if unknown:
        raise typer.BadParameter(f"--baselines {unknown}: choose among standard, topk15, topk, "
                                 "jumprelu, batchtopk, gated_relu")  # fmt: skip
    summary = run_steer_icl(
        SteerICLConfig(
            dataset=dataset,
            model=model,
            layer=layer,
            hook=hook,
            split=split,
            text_column=text_column,
            label_column=label_column,
            label_words=_label_words(label_words),
            shots=shots,
            n_vector_prompts=vector_prompts,
            n_eval_prompts=eval_prompts,
            top=top,
            baselines=names,
            strengths=_csv(strengths, float, "--strengths"),
            normalise=normalise,
            steps=steps,
            expansion=expansion,
            device=device,
            seed=seed,
            out=out,
        )
    )
    typer.echo((out / "steer.md").read_text())
    typer.echo(f"results in {out}/ ({sum(summary['seconds'].values()):.0f} s)")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
