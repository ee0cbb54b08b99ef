"""Text sources and their tokenisation into fixed-length ``input_ids`` rows, as SAELens expects.

A source is a Hugging Face dataset name (streamed from the hub), a local file or a folder of them:

* ``.txt``: one document per line, or, when the file has blank lines, blank-line separated blocks;
* ``.tsv`` / ``.csv``: a text column (named, or the first of ``text``, ``sentence``, ``content``,
  ``document``, ``review``);
* ``.jsonl``: one JSON object per line with such a text field.

``default_corpus()`` is the quickstart's embedded corpus: the Lee news corpus (300 documents,
~60k words) that the ``gensim`` wheel ships in ``gensim/test/test_data``, found without importing
gensim (``pip install "sae-lens-bae[corpus]"``).
"""

from __future__ import annotations

import csv
import importlib.util
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from datasets import Dataset
from sae_lens.tokenization_and_batching import concat_and_batch_sequences
from transformers import PreTrainedTokenizerBase

__all__ = ["default_corpus", "iter_texts", "load_token_dataset", "tokenize_texts"]

TEXT_COLUMNS = ("text", "sentence", "content", "document", "review")
SUFFIXES = (".txt", ".tsv", ".csv", ".jsonl", ".cor")


def default_corpus() -> Path:
    """Path of the embedded default corpus (gensim's ``lee_background.cor``)."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The default corpus ships inside the gensim wheel, which is not installed. Install it "
            'with: pip install "sae-lens-bae[corpus]" (or pass your own --dataset).'
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "test" / "test_data"
    path = path / "lee_background.cor"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the installed gensim package")
    return path


def _pick_column(columns: Iterable[str], text_column: str | None, where: str) -> str:
    columns = list(columns)
    if text_column is not None:
        if text_column not in columns:
            raise ValueError(f"{where} has no column {text_column!r}; its columns are {columns}")
        return text_column
    for name in TEXT_COLUMNS:
        if name in columns:
            return name
    raise ValueError(
        f"{where} has no text column: looked for {list(TEXT_COLUMNS)}, found {columns}. "
        "Name the column with text_column=... (CLI: --text-column)."
    )


def _iter_file(path: Path, text_column: str | None) -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix in (".txt", ".cor"):
        content = path.read_text(encoding="utf-8")
        lines = content.splitlines()
        if any(not line.strip() for line in lines):
            blocks = [b.strip() for b in content.replace("\r\n", "\n").split("\n\n")]
            yield from (b for b in blocks if b)
        else:
            yield from (line.strip() for line in lines if line.strip())
    elif suffix in (".tsv", ".csv"):
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ",")
            column = _pick_column(reader.fieldnames or [], text_column, str(path))
            for row in reader:
                if row[column] and row[column].strip():
                    yield row[column].strip()
    elif suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{number} is not valid JSON: {e}") from e
                column = _pick_column(record, text_column, f"{path}:{number}")
                if str(record[column]).strip():
                    yield str(record[column]).strip()
    else:
        raise ValueError(f"Unsupported file type {path.name}; supported: {', '.join(SUFFIXES)}")


def iter_texts(
    source: str | Path, text_column: str | None = None, split: str = "train"
) -> Iterator[str]:
    """Texts from a local file, a folder of files, or a Hugging Face dataset name."""
    path = Path(source).expanduser()
    if path.is_file():
        yield from _iter_file(path, text_column)
        return
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in SUFFIXES)
        if not files:
            raise FileNotFoundError(f"No {'/'.join(SUFFIXES)} files in folder {path}")
        for file in files:
            yield from _iter_file(file, text_column)
        return
    if str(source).startswith((".", "/", "~")) or path.suffix.lower() in SUFFIXES:
        raise FileNotFoundError(f"No such file or folder: {path}")
    from datasets import load_dataset

    dataset = load_dataset(str(source), split=split, streaming=True)
    column = None
    for record in dataset:
        if column is None:  # streamed datasets may only know their columns once read
            columns = dataset.column_names or list(record)
            column = _pick_column(columns, text_column, f"dataset {source!r}")
        if record[column]:
            yield record[column]


def tokenize_texts(
    texts: Iterable[str],
    tokenizer: PreTrainedTokenizerBase,
    context_size: int,
    *,
    prepend_bos: bool = True,
    max_sequences: int | None = None,
) -> Dataset:
    """Concatenate texts into rows of exactly ``context_size`` token ids (column ``input_ids``).

    As SAELens' pretokenizer does: each row starts with BOS (if ``prepend_bos``) and documents are
    separated by BOS, so no row depends on where a document happened to start.
    """
    bos = tokenizer.bos_token_id if prepend_bos else None
    if prepend_bos and bos is None:
        raise ValueError("The tokenizer has no bos_token; pass prepend_bos=False")

    def token_stream() -> Iterator[torch.Tensor]:
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if ids:
                yield torch.tensor(ids, dtype=torch.long)

    rows = []
    for row in concat_and_batch_sequences(
        token_stream(),
        context_size=context_size,
        begin_batch_token_id=bos,
        sequence_separator_token_id=bos,
    ):
        if row.shape[0] == context_size:  # the last partial row is dropped
            rows.append(row.tolist())
        if max_sequences is not None and len(rows) >= max_sequences:
            break
    if not rows:
        raise ValueError(
            f"The texts hold fewer than context_size={context_size} tokens; use more text or a "
            "smaller context size"
        )
    return Dataset.from_dict({"input_ids": rows})


def load_token_dataset(
    source: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    context_size: int,
    *,
    text_column: str | None = None,
    split: str = "train",
    prepend_bos: bool = True,
    max_sequences: int | None = None,
) -> Dataset:
    """``iter_texts`` then ``tokenize_texts``: a tokenised dataset ready for SAELens."""
    return tokenize_texts(
        iter_texts(source, text_column=text_column, split=split),
        tokenizer,
        context_size,
        prepend_bos=prepend_bos,
        max_sequences=max_sequences,
    )
