"""In-context-learning prompts: labelled sentences as demonstrations and a query, tokenised.

The ICL entropy trace and ICL steering read the same prompts: ``k`` demonstrations
``sentence: <x> sentiment: <label>`` and a query ``sentence: <q> sentiment:``, whose answer is
read from the logits of the label words' first tokens at the query's last token.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from sae_lens_bae.data import load_labelled_sentences

__all__ = [
    "ICLTemplate",
    "build_icl_prompts",
    "encode_prompts",
    "first_token_ids",
    "load_icl_pairs",
]


@dataclass(frozen=True)
class ICLTemplate:
    """How demonstrations and the query are written; ``{sentence}`` and ``{label}`` are filled."""

    demonstration: str = "sentence: {sentence} sentiment: {label}\n"
    query: str = "sentence: {sentence} sentiment:"

    def __post_init__(self) -> None:
        for name in ("demonstration", "query"):
            if "{sentence}" not in getattr(self, name):
                raise ValueError(f"The {name} template must contain {{sentence}}")
        if "{label}" not in self.demonstration or "{label}" in self.query:
            raise ValueError("Only the demonstration template holds {label} (the query asks it)")


def build_icl_prompts(
    pairs: Sequence[tuple[str, str]],
    shots: int,
    n_prompts: int,
    *,
    template: ICLTemplate | None = None,
    seed: int = 0,
) -> list[tuple[str, str]]:
    """``n_prompts`` (prompt, query label) pairs with ``shots`` demonstrations each.

    Queries are ``pairs[:n_prompts]`` (the same for every ``shots``), demonstrations are drawn
    without replacement from the remaining pairs, independently per prompt.
    """
    template = template or ICLTemplate()
    if n_prompts < 1 or shots < 0:
        raise ValueError(f"Need n_prompts >= 1 and shots >= 0, got {n_prompts} and {shots}")
    pool = list(pairs[n_prompts:])
    if len(pairs) < n_prompts or (shots and len(pool) < shots):
        raise ValueError(
            f"{len(pairs)} labelled sentences cannot give {n_prompts} queries plus {shots} "
            "demonstrations each; use fewer prompts or a larger set"
        )
    rng = random.Random(seed * 1000 + shots)
    prompts = []
    for sentence, label in pairs[:n_prompts]:
        demos = rng.sample(pool, shots)
        text = "".join(template.demonstration.format(sentence=x, label=y) for x, y in demos)
        prompts.append((text + template.query.format(sentence=sentence), label))
    return prompts


def encode_prompts(
    prompts: Sequence[str], tokenizer: PreTrainedTokenizerBase
) -> tuple[Int[Tensor, "n ctx"], Int[Tensor, "n 1"]]:
    """BOS + prompt ids, right-padded with BOS, and each row's last real position ([n, 1])."""
    bos = tokenizer.bos_token_id
    if bos is None:
        raise ValueError("ICL tracing needs a tokenizer with a bos_token")
    rows = [[bos, *tokenizer(p, add_special_tokens=False)["input_ids"]] for p in prompts]
    width = max(len(r) for r in rows)
    tokens = torch.tensor([r + [bos] * (width - len(r)) for r in rows], dtype=torch.long)
    return tokens, torch.tensor([[len(r) - 1] for r in rows])


def first_token_ids(tokenizer: PreTrainedTokenizerBase, words: Sequence[str]) -> list[int]:
    """The first token of each word as it follows other text (with a leading space): what a
    label word's logit is read from. Errors if two words share it."""
    ids = [tokenizer(" " + word, add_special_tokens=False)["input_ids"][0] for word in words]
    if len(set(ids)) != len(ids):
        names = [tokenizer.convert_ids_to_tokens(i) for i in ids]
        raise ValueError(
            f"Words {list(words)} share first tokens {names}; pick label words that start "
            "with different tokens"
        )
    return ids


def load_icl_pairs(
    dataset: str | Path,
    *,
    split: str = "train",
    text_column: str | None = None,
    label_column: str = "label",
    label_words: dict[str, str] | None = None,
    max_sentence_words: int = 0,
) -> list[tuple[str, str]]:
    """(sentence, label word) pairs of a labelled sentence set (see
    ``sae_lens_bae.data.load_labelled_sentences``), without sentences longer than
    ``max_sentence_words`` words (0: keep all), since long reviews make 8-shot prompts very long."""
    pairs = load_labelled_sentences(
        dataset,
        split=split,
        text_column=text_column,
        label_column=label_column,
        label_words=label_words,
    )
    if max_sentence_words:
        pairs = [p for p in pairs if len(p[0].split()) <= max_sentence_words]
    return pairs
