"""What several experiments share: the states of one layer they read, the ComSem columns of
their records, the labelled sentences of the ICL experiments, and how a nested training recipe
appears on the command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sae_lens_bae.activations import LayerActivations, harvest_layer
from sae_lens_bae.checks import check_ranges, ranged
from sae_lens_bae.comsem import ClientConfig, comsem_columns
from sae_lens_bae.entropy import EntropyRecipe
from sae_lens_bae.features import FeatureRecords
from sae_lens_bae.outliers import NORM_RATIO
from sae_lens_bae.prompts import load_icl_pairs

__all__ = ["TRAINING_CHECKPOINT", "ComSemJudge", "LabelledSentences", "LayerData", "recipe_field"]

TRAINING_CHECKPOINT = "training-checkpoint"
"""Where in its output folder a trace's BAE training saves itself until the results are written:
the same command run again after a kill goes on from there (``train_stacked_baes``)."""


def recipe_field(default: EntropyRecipe) -> Any:
    """A config field holding an ``EntropyRecipe``: its fields become options of the command
    (``--steps``, ``--lr``...), its ``batch_size`` named ``--bae-batch-size`` beside the forward
    passes' ``--batch-size`` (see ``sae_lens_bae.cli.options``)."""
    return field(default=default, metadata={"cli_names": {"batch_size": "bae_batch_size"}})


@dataclass
class LayerData:
    """The states a one-layer experiment trains and evaluates on: one hook point of a model over a
    text (``hook_resid_post`` of the middle layer by default), harvested once, cleaned, scaled and
    split (``harvest_layer``)."""

    dataset: str | None = None
    """Text file, folder or HF dataset (default: the embedded corpus)."""
    model: str = "smollm2-135m"
    """Embedded name, local HF directory or TransformerLens name."""
    hook: str = "hook_resid_post"
    """Hook point: a full TransformerLens name, or a name inside block --layer."""
    layer: int | None = ranged(None, low=0)
    """Block of a --hook inside a block (default: the middle one)."""
    text_column: str | None = None
    """Text column of a table/JSONL dataset."""
    context_size: int = ranged(128, low=1)
    """Tokens per harvested sequence."""
    max_sequences: int | None = ranged(512, low=1)
    """Cap on harvested sequences."""
    held_out_fraction: float = ranged(0.1, above=0.0, below=1.0)
    """Fraction of sequences held out for the statistics."""
    outlier_norm_ratio: float | None = ranged(NORM_RATIO, above=1.0)
    """Extreme states (norm above this times the median: attention sinks) are dropped and
    counted; none keeps them."""
    device: str = "cpu"
    """Torch device."""

    def __post_init__(self) -> None:
        check_ranges(self)

    def harvest(
        self,
        out: Path,
        *,
        extra_hooks: tuple[str, ...] = (),
        held_out_parts: int = 1,
        progress: bool = True,
    ) -> LayerActivations:
        """Harvest this layer (its cache under ``out/activations``), cleaned, scaled, split;
        ``held_out_parts`` x ``held_out_fraction`` of the sequences held out (one fraction for
        each held-out split a caller cuts them into, ``held_out_splits``)."""
        return harvest_layer(
            self.model,
            self.dataset,
            self.layer,
            Path(out) / "activations",
            hook=self.hook,
            extra_hooks=extra_hooks,
            text_column=self.text_column,
            context_size=self.context_size,
            max_sequences=self.max_sequences,
            held_out_fraction=self.held_out_fraction * held_out_parts,
            outlier_norm_ratio=self.outlier_norm_ratio,
            device=self.device,
            progress=progress,
        )


@dataclass
class ComSemJudge:
    """Optional ComSem columns of an experiment: its models' records judged by an LLM."""

    comsem_llm: str | None = None
    """Add ComSem columns: records judged by this LLM."""
    comsem_base_url: str | None = None
    """The LLM's OpenAI-compatible endpoint (default: OpenAI)."""
    comsem_max_features: int | None = ranged(None, low=1)
    """ComSem on the first N activated features of each model (default: all)."""

    def judge(
        self,
        records: dict[str, FeatureRecords],
        tokenizer: Any,
        rows: dict[str, dict[str, Any]],
        out: Path,
        progress: bool,
    ) -> dict[str, list[float]]:
        """``comsem_columns`` of ``records`` into ``rows`` (reports under ``out/comsem``), or
        nothing without an LLM."""
        if self.comsem_llm is None:
            return {}
        client = ClientConfig(model=self.comsem_llm, base_url=self.comsem_base_url)
        return comsem_columns(
            records, tokenizer, client, rows, out / "comsem", self.comsem_max_features, progress
        )


@dataclass
class LabelledSentences:
    """The labelled sentences an ICL experiment builds its prompts from."""

    dataset: str
    """Labelled sentences: TSV/CSV/JSONL, a folder (SST-2's <split>.tsv, MR's <label>.txt) or
    an HF name."""
    model: str = "smollm2-135m"
    """Embedded name, local HF directory or TransformerLens name."""
    split: str = "train"
    """Split file (<split>.tsv) or HF split."""
    text_column: str | None = None
    """Text column (default: the first of text, sentence, content, document, review)."""
    label_column: str = "label"
    """Label column."""
    label_words: dict[str, str] | None = None
    """label=word pairs, e.g. 0=negative,1=positive (default: 0/neg negative, 1/pos positive)."""
    max_sentence_words: int = 24
    """Longer sentences are skipped; 0 keeps all."""

    def pairs(self) -> list[tuple[str, str]]:
        """The (sentence, label word) pairs (``sae_lens_bae.prompts.load_icl_pairs``)."""
        return load_icl_pairs(
            self.dataset,
            split=self.split,
            text_column=self.text_column,
            label_column=self.label_column,
            label_words=self.label_words,
            max_sentence_words=self.max_sentence_words,
        )
