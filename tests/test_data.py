import json

import datasets
import pytest
from transformers import AutoTokenizer

import sae_lens_bae.data
from sae_lens_bae.data import default_corpus, iter_texts, load_token_dataset, tokenize_texts


@pytest.fixture(scope="module")
def tokenizer(tiny_hf_llama_dir):
    return AutoTokenizer.from_pretrained(tiny_hf_llama_dir)


def test_txt_one_document_per_line(tmp_path):
    (tmp_path / "a.txt").write_text("first doc\nsecond doc\n\n")
    # a trailing blank line alone still means "blocks": the two lines form one block
    assert list(iter_texts(tmp_path / "a.txt")) == ["first doc\nsecond doc"]
    (tmp_path / "b.txt").write_text("first doc\nsecond doc\nthird\n")
    assert list(iter_texts(tmp_path / "b.txt")) == ["first doc", "second doc", "third"]


def test_txt_blank_line_separated_blocks(tmp_path):
    (tmp_path / "a.txt").write_text("para one\ncontinues\n\n\npara two\n")
    assert list(iter_texts(tmp_path / "a.txt")) == ["para one\ncontinues", "para two"]


def test_tsv_csv_jsonl_and_folder(tmp_path):
    (tmp_path / "t.tsv").write_text("label\tsentence\n1\tgood film\n0\tbad film\n")
    (tmp_path / "c.csv").write_text('id,text\n1,"hello, world"\n')
    (tmp_path / "j.jsonl").write_text(json.dumps({"content": "json doc"}) + "\n\n")
    assert list(iter_texts(tmp_path / "t.tsv")) == ["good film", "bad film"]
    assert list(iter_texts(tmp_path / "c.csv")) == ["hello, world"]
    assert list(iter_texts(tmp_path / "j.jsonl")) == ["json doc"]
    assert list(iter_texts(tmp_path)) == ["hello, world", "json doc", "good film", "bad film"]
    assert list(iter_texts(tmp_path / "t.tsv", text_column="label")) == ["1", "0"]


def test_hf_dataset_name_is_streamed(monkeypatch):
    calls = {}

    def fake_load_dataset(name, config, split, streaming):
        calls.update(name=name, config=config, split=split, streaming=streaming)
        return datasets.IterableDataset.from_generator(
            lambda: iter([{"id": 1, "text": "from the hub"}, {"id": 2, "text": ""}])
        )

    monkeypatch.setattr(sae_lens_bae.data, "load_dataset", fake_load_dataset)
    assert list(iter_texts("someone/corpus", split="validation")) == ["from the hub"]
    assert calls == {
        "name": "someone/corpus",
        "config": None,
        "split": "validation",
        "streaming": True,
    }


def test_dataset_without_text_column(tmp_path):
    (tmp_path / "t.tsv").write_text("label\tscore\n1\t0.5\n")
    with pytest.raises(ValueError, match=r"no text column.*found \['label', 'score'\]"):
        list(iter_texts(tmp_path / "t.tsv"))
    with pytest.raises(ValueError, match="no column 'body'"):
        list(iter_texts(tmp_path / "t.tsv", text_column="body"))


def test_missing_file_and_unsupported_type(tmp_path):
    with pytest.raises(FileNotFoundError, match="No such file"):
        list(iter_texts(tmp_path / "missing.txt"))
    (tmp_path / "x.parquet").write_text("")
    with pytest.raises(ValueError, match="Unsupported file type"):
        list(iter_texts(tmp_path / "x.parquet"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="No .* files in folder"):
        list(iter_texts(tmp_path / "empty"))


def test_tokenize_to_fixed_rows_with_bos(tokenizer):
    texts = ["w3 w4 w5", "w6 w7", "w8 w9 w10 w11 w12 w13"]
    ds = tokenize_texts(texts, tokenizer, context_size=5)
    rows = ds["input_ids"]
    assert all(len(r) == 5 for r in rows)
    assert all(r[0] == tokenizer.bos_token_id for r in rows)
    # documents are separated by BOS: <s> w3 w4 w5 <s> | <s> w6 w7 <s> w8 | ...
    assert rows[0] == tokenizer.convert_tokens_to_ids(["<s>", "w3", "w4", "w5", "<s>"])
    with pytest.raises(ValueError, match="fewer than context_size"):
        tokenize_texts(["w3"], tokenizer, context_size=50)


def test_load_token_dataset_from_file(tiny_corpus, tokenizer):
    ds = load_token_dataset(tiny_corpus, tokenizer, context_size=16, max_sequences=10)
    assert ds.column_names == ["input_ids"] and len(ds) == 10


def test_default_corpus_is_gensims_lee_corpus():
    path = default_corpus()  # needs the [corpus] extra, installed by `make install`
    assert path.name == "lee_background.cor"
    texts = list(iter_texts(path))
    assert len(texts) == 300 and "bushfire" in texts[0]


def test_fasttext_labelled_lines_and_the_embedded_labelled_sentences(tmp_path):
    """fastText's ``__label__<label> <sentence>`` lines are labelled sentences; the 200 movie-review
    sentences gensim ships read as 100 negative and 100 positive, none with its prefix."""
    from sae_lens_bae.data import default_labelled_sentences, load_labelled_sentences

    path = tmp_path / "labelled.txt"
    path.write_text("__label__neg dull and slow .\n\n__label__pos a small joy .\n")
    assert load_labelled_sentences(path) == [("dull and slow .", "negative"),
                                             ("a small joy .", "positive")]  # fmt: skip
    path.write_text("__label__neg dull .\nno label here\n")
    with pytest.raises(ValueError, match=r"labelled.txt:2 has no __label__ prefix"):
        load_labelled_sentences(path)
    pairs = load_labelled_sentences(default_labelled_sentences())
    assert len(pairs) == 200 and [label for _, label in pairs].count("negative") == 100
    assert pairs[0] == ("simplistic , silly and tedious .", "negative")
    assert not any(text.startswith("__label__") for text, _ in pairs)
