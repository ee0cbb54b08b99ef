"""Text sources and their tokenisation into fixed-length ``input_ids`` rows, as SAELens expects.

A source is a Hugging Face dataset name (streamed from the hub), a local file or a folder of them:

* ``.txt``: one document per line, or, when the file has blank lines, blank-line separated blocks;
* ``.tsv`` / ``.csv``: a text column (named, or the first of ``text``, ``sentence``, ``content``,
  ``document``, ``review``);
* ``.jsonl``: one JSON object per line with such a text field.

``default_corpus()`` is the quickstart's embedded corpus: the Lee news corpus (300 documents,
~60k words) that the ``gensim`` wheel ships in ``gensim/test/test_data``, found without importing
gensim (``pip install "sae-lens-bae[corpus]"``). ``default_labelled_sentences()`` is the 200
labelled movie-review sentences beside it (Pang and Lee's polarity data, fastText's
``__label__neg text`` lines): labelled sentences for probing, and, their sentences alone, an
out-of-distribution text for models trained on the news corpus.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, load_dataset
from sae_lens.tokenization_and_batching import concat_and_batch_sequences
from transformers import PreTrainedTokenizerBase

from sae_lens_bae.reports import read_jsonl

__all__ = [
    "LABEL_WORDS",
    "default_corpus",
    "default_labelled_sentences",
    "document_windows",
    "hub_dataset",
    "iter_texts",
    "load_labelled_sentences",
    "load_token_dataset",
    "token_rows",
    "tokenize_texts",
]

TEXT_COLUMNS = ("text", "sentence", "content", "document", "review")
SUFFIXES = (".txt", ".tsv", ".csv", ".jsonl", ".cor")


def token_rows(dataset: Dataset | torch.Tensor) -> torch.Tensor:
    """A token dataset's ``input_ids`` as one [n_seq, ctx] tensor, whatever the dataset's format
    (SAELens' runner sets a tokenized dataset to torch format in place: rows become tensors)."""
    if isinstance(dataset, torch.Tensor):
        return dataset
    rows = (
        dataset.with_format("torch")["input_ids"]
        if isinstance(dataset, Dataset)
        else (dataset["input_ids"])
    )
    if isinstance(rows, torch.Tensor):
        return rows
    return torch.stack([torch.as_tensor(row) for row in rows])


def _gensim_test_file(name: str) -> Path:
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The default texts ship inside the gensim wheel, which is not installed. Install it "
            'with: pip install "sae-lens-bae[corpus]" (or pass your own --dataset).'
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "test" / "test_data" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the installed gensim package")
    return path


def default_corpus() -> Path:
    """Path of the embedded default corpus (gensim's ``lee_background.cor``)."""
    return _gensim_test_file("lee_background.cor")


def default_labelled_sentences() -> Path:
    """Path of the embedded labelled sentences (gensim's ``pang_lee_polarity.cor``: 200 movie-review
    sentences, 100 negative and 100 positive)."""
    return _gensim_test_file("pang_lee_polarity.cor")


FASTTEXT_LABEL = re.compile(r"^__label__(\S+)\s+")
"""A fastText line's label prefix (``__label__neg simplistic , silly ...``)."""


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
    texts = 0
    try:
        for text in _texts_of_file(path, text_column):
            texts += 1
            yield text
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text; give a text, TSV/CSV or JSONL file") from None
    if texts == 0:
        raise ValueError(f"{path} holds no text; give a file with at least one line of text")


def _texts_of_file(path: Path, text_column: str | None) -> Iterator[str]:
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
                    raise ValueError(f"{path}:{number} is not valid JSON: {e}") from None
                if not isinstance(record, dict):
                    raise ValueError(f"{path}:{number} is not a JSON object; one per line")
                column = _pick_column(record, text_column, f"{path}:{number}")
                if str(record[column]).strip():
                    yield str(record[column]).strip()
    else:
        raise ValueError(f"Unsupported file type {path.name}; supported: {', '.join(SUFFIXES)}")


def iter_texts(
    source: str | Path, text_column: str | None = None, split: str = "train"
) -> Iterator[str]:
    """Texts from a local file, a folder of files, or a Hugging Face dataset name (``name:config``
    for one of its configurations). A missing file or an empty folder fails here, at the call,
    not when the first text is read."""
    path = Path(source).expanduser()
    if path.is_file():
        return _iter_file(path, text_column)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in SUFFIXES)
        if not files:
            raise FileNotFoundError(f"No {'/'.join(SUFFIXES)} files in folder {path}")
        return (text for file in files for text in _iter_file(file, text_column))
    if str(source).startswith((".", "/", "~")) or path.suffix.lower() in SUFFIXES:
        raise FileNotFoundError(f"No such file or folder: {path}")
    return _iter_hub(str(source), text_column, split)


def hub_dataset(source: str, split: str, streaming: bool = False) -> Any:
    """A Hugging Face dataset; ``name:config`` picks one configuration (``wikitext:wikitext-2``)."""
    name, _, config = source.partition(":")
    return load_dataset(name, config or None, split=split, streaming=streaming)


def _iter_hub(source: str, text_column: str | None, split: str) -> Iterator[str]:
    dataset = hub_dataset(source, split, streaming=True)
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


def document_windows(
    texts: Iterable[str],
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    *,
    max_sequences: int | None = None,
) -> torch.Tensor:
    """Rows of BOS + ``length`` consecutive tokens of *one* document, as an ``[n, 1 + length]``
    tensor.

    For tracing by token position: unlike ``tokenize_texts``' concatenated rows, no row crosses a
    document boundary, so position p always has exactly p tokens of context after the BOS. Each
    document is cut into non-overlapping windows; its remainder shorter than ``length`` is dropped.
    """
    if length < 1:
        raise ValueError(f"length must be at least 1, got {length}")
    bos = tokenizer.bos_token_id
    if bos is None:
        raise ValueError("document_windows needs a tokenizer with a bos_token")
    rows: list[list[int]] = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(0, len(ids) - length + 1, length):
            rows.append([bos, *ids[start : start + length]])
            if max_sequences is not None and len(rows) >= max_sequences:
                return torch.tensor(rows, dtype=torch.long)
    if not rows:
        raise ValueError(
            f"No document has {length} tokens; use longer texts or a smaller maximum position"
        )
    return torch.tensor(rows, dtype=torch.long)


LABEL_WORDS = {"0": "negative", "1": "positive", "neg": "negative", "pos": "positive"}
"""Default label words: SST-2's 0/1 and the MR files' neg/pos."""


def load_labelled_sentences(
    source: str | Path,
    *,
    split: str = "train",
    text_column: str | None = None,
    label_column: str = "label",
    label_words: dict[str, str] | None = None,
) -> list[tuple[str, str]]:
    """(sentence, label word) pairs from a labelled sentence set.

    ``source`` is a TSV/CSV/JSONL file with a text and a label column (SST-2's ``train.tsv``), a
    folder holding ``<split>.tsv`` (SST-2), a folder of one ``<label>.txt`` file per class with one
    sentence per line (MR's ``pos.txt``/``neg.txt``), or a Hugging Face dataset name (e.g.
    ``stanfordnlp/sst2``; ClassLabel ids are mapped to their names). Labels become words with
    ``label_words`` (default: 0/neg -> negative, 1/pos -> positive; unmapped labels are kept).
    """
    words = {**LABEL_WORDS, **(label_words or {})}
    pairs = [
        (text, words.get(label, label))
        for text, label in _labelled(source, split, text_column, label_column)
    ]
    if not pairs:
        raise ValueError(f"{source} holds no labelled sentences")
    if len({label for _, label in pairs}) < 2:
        raise ValueError(f"{source} has a single label {pairs[0][1]!r}; ICL needs at least two")
    return pairs


def _labelled_records(
    path: Path, records: Iterable[dict], text_column: str | None, label_column: str
) -> Iterator[tuple[str, str]]:
    for number, record in enumerate(records, start=2):
        if label_column not in record:
            raise ValueError(
                f"{path} has no label column {label_column!r}; its columns are "
                f"{list(record)}. Name it with label_column=... (CLI: --label-column)."
            )
        column = _pick_column(record, text_column, f"{path}:{number}")
        if str(record[column]).strip():
            yield str(record[column]).strip(), str(record[label_column]).strip()


def _labelled(
    source: str | Path, split: str, text_column: str | None, label_column: str
) -> Iterator[tuple[str, str]]:
    path = Path(source).expanduser()
    if path.is_dir():
        tables = [path / f"{split}{suffix}" for suffix in (".tsv", ".csv", ".jsonl")]
        table = next((t for t in tables if t.exists()), None)
        if table is not None:
            yield from _labelled(table, split, text_column, label_column)
            return
        classes = sorted(path.glob("*.txt"))
        classes = [c for c in classes if c.stem.lower() not in ("readme", "license")]
        if len(classes) < 2:
            raise FileNotFoundError(
                f"{path} has neither {split}.tsv/.csv/.jsonl nor one <label>.txt file per class"
            )
        for file in classes:
            for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.strip():
                    yield line.strip(), file.stem
        return
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in (".txt", ".cor"):  # fastText's __label__<label> <text> lines
            text = path.read_text(encoding="utf-8", errors="replace")  # as MR's files are read
            for number, line in enumerate(text.splitlines(), 1):
                label = FASTTEXT_LABEL.match(line)
                if line.strip() and label is None:
                    raise ValueError(
                        f"{path}:{number} has no __label__ prefix; labelled text files hold "
                        "fastText lines (__label__<label> <sentence>)"
                    )
                if label is not None and line[label.end() :].strip():
                    yield line[label.end() :].strip(), label.group(1)
            return
        if suffix == ".jsonl":
            fix = "give one JSON object per line, with a text and a label field"
            records: Iterable[dict] = read_jsonl(path, "labelled sentences", fix)
        elif suffix in (".tsv", ".csv"):
            records = csv.DictReader(
                path.open(encoding="utf-8", newline=""), delimiter="\t" if suffix == ".tsv" else ","
            )
        else:
            raise ValueError(
                f"Labelled sentences come from .tsv/.csv/.jsonl or fastText .txt files, not "
                f"{path.name}"
            )
        try:
            yield from _labelled_records(path, records, text_column, label_column)
        except UnicodeDecodeError:
            raise ValueError(f"{path} is not UTF-8 text; give a TSV/CSV or JSONL file") from None
        return

    if str(source).startswith((".", "/", "~")) or path.suffix.lower() in SUFFIXES:
        raise FileNotFoundError(f"No such file or folder: {path}")
    dataset = load_dataset(str(source), split=split)
    column = _pick_column(dataset.column_names, text_column, f"dataset {source!r}")
    if label_column not in dataset.column_names:
        raise ValueError(
            f"dataset {source!r} has no label column {label_column!r}; its columns are "
            f"{dataset.column_names}"
        )
    feature = dataset.features[label_column]
    names = getattr(feature, "names", None)
    for record in dataset:
        label = record[label_column]
        yield str(record[column]).strip(), names[label] if names else str(label)
