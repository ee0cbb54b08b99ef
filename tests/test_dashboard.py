"""The feature dashboard on hand-made records: one page per feature with records, its contexts in
strength order with the token marked, the index linking them; parsed back from the HTML."""

from __future__ import annotations

import json
from html import escape
from html.parser import HTMLParser

import pytest
import torch

from sae_lens_bae.dashboard import DashboardConfig, dashboard, histogram_svg
from sae_lens_bae.features.records import FeatureRecords
from sae_lens_bae.saes.bae import BAE, BAEConfig


class _Page(HTMLParser):
    """Marked tokens, context lines, magnitudes, links, table rows and scripts of a page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.marks: list[str] = []
        self.contexts: list[str] = []
        self.magnitudes: list[str] = []
        self.links: list[str] = []
        self.rows = 0
        self.external: list[str] = []
        self._stack: list[str] = []
        self._context: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self._stack.append(attrs.get("class") or tag)
        if tag == "a":
            self.links.append(attrs["href"])
        if tag == "tr":
            self.rows += 1
        if tag in ("script", "link", "img") and (attrs.get("src") or attrs.get("href")):
            self.external.append(attrs.get("src") or attrs.get("href"))
        if attrs.get("class") == "context":
            self._context = []

    def handle_endtag(self, tag):
        top = self._stack.pop()
        if top == "context" and self._context is not None:
            self.contexts.append("".join(self._context))
            self._context = None
        del tag

    def handle_data(self, data):
        where = self._stack[-1] if self._stack else ""
        if where == "mark":
            self.marks.append(data)
        if where == "magnitude":
            self.magnitudes.append(data)
        elif self._context is not None:
            self._context.append(f"[{data}]" if where == "mark" else data)


@pytest.fixture
def hand_made(tiny_hf_llama_dir, tmp_path):
    """Two sequences; four records of three features (feature 3 has none)."""
    records = FeatureRecords(
        features=torch.tensor([[0, 2], [0, -1], [1, 0], [1, -1]]),
        magnitudes=torch.tensor([[0.9, 0.1], [0.5, 0.0], [0.8, 0.3], [0.7, 0.0]]),
        token_positions=torch.tensor([[0, 1], [0, 3], [1, 2], [1, 4]]),
        token_ids=torch.tensor([5, 7, 10, 12]),
        d_sae=4,
        magnitude="burstiness",
        sequences=torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 11, 12]]),
        info={"model": str(tiny_hf_llama_dir)},
    )
    path = tmp_path / "records.safetensors"
    records.save(path)
    comsem = tmp_path / "comsem"
    comsem.mkdir()
    (comsem / "features.jsonl").write_text(
        json.dumps({"feature": 1, "explanation": "the words <w10> & w12", "score": 0.75}) + "\n"
    )
    return path, comsem


def test_one_page_per_feature_with_its_contexts(hand_made, tmp_path):
    path, comsem = hand_made
    out = tmp_path / "site"
    summary = dashboard(DashboardConfig(records=path, out=out, comsem=comsem), progress=False)
    assert summary["features"] == 3
    assert sorted(p.name for p in (out / "features").iterdir()) == [
        "000000.html", "000001.html", "000002.html"]  # fmt: skip
    expected = {0: (["w5", "w7", "w10"], ["0.900", "0.500", "0.300"]),
                1: (["w10", "w12"], ["0.800", "0.700"]),
                2: (["w5"], ["0.100"])}  # fmt: skip
    for feature, (marks, magnitudes) in expected.items():
        page = _Page((out / "features" / f"{feature:06d}.html").read_text())
        assert page.marks == marks and page.magnitudes == magnitudes
        assert page.links == ["../index.html"] and page.external == []
    first = _Page((out / "features" / "000000.html").read_text())
    # decoded pieces as the tokenizer gives them (a word-level one: no spaces at the joins);
    # the BOS is not shown, and at most 4 tokens after
    assert first.contexts[0] == "[w5]w6 w7 w8"
    assert first.contexts[1] == "w5 w6[w7]w8"
    assert "every record at 0.1000" in (out / "features" / "000002.html").read_text()
    one = (out / "features" / "000001.html").read_text()
    assert "the words &lt;w10&gt; &amp; w12" in one and "(ComSem score 0.75)" in one
    assert one.count("<rect") == 30  # the histogram's bins
    index = _Page((out / "index.html").read_text())
    assert index.links == [f"features/{f:06d}.html" for f in (0, 1, 2)]
    assert index.rows == 4 and index.external == []  # header + 3 features; no CDN
    text = (out / "index.html").read_text()
    assert 'data-value="3"' in text and 'data-value="0.75"' in text  # records, score (sortable)


def test_logit_lens_and_rarity_from_the_model(hand_made, tiny_hf_llama_dir, tmp_path):
    from sae_lens_bae.models import load_model

    path, _ = hand_made
    torch.manual_seed(0)
    bae = BAE(BAEConfig(d_in=32, d_sae=4))
    with torch.no_grad():
        bae.code_mean.copy_(torch.tensor([0.1, 0.95, 0.5, 0.2]))
    bae.save_model(tmp_path / "bae")
    out = tmp_path / "site"
    dashboard(DashboardConfig(records=path, out=out, sae=tmp_path / "bae", lens_tokens=3),
              progress=False)  # fmt: skip
    page = (out / "features" / "000001.html").read_text()
    assert "rarity min(p, 1-p) 0.0500" in page
    model = load_model(tiny_hf_llama_dir)
    logits = bae.W_dec[1] @ model.W_U
    promoted = [model.tokenizer.decode([int(i)]) for i in logits.topk(3).indices]
    suppressed = [model.tokenizer.decode([int(i)]) for i in (-logits).topk(3).indices]
    lens = page[page.index("Logit lens") :]
    promotes, suppresses = lens.split("suppresses")
    assert [t for t in promoted if escape(repr(t)) in promotes] == promoted
    assert [t for t in suppressed if escape(repr(t)) in suppresses] == suppressed


def test_records_of_another_model_are_refused(hand_made, tmp_path):
    path, _ = hand_made
    BAE(BAEConfig(d_in=32, d_sae=6)).save_model(tmp_path / "other")
    with pytest.raises(ValueError, match="has 6 features, the records 4"):
        dashboard(DashboardConfig(records=path, out=tmp_path / "x", sae=tmp_path / "other"))
    with pytest.raises(FileNotFoundError, match="records: no file"):
        dashboard(DashboardConfig(records=tmp_path / "none.safetensors"))


def test_histogram_bins_count_every_value():
    svg = histogram_svg([0.0, 0.0, 1.0, 2.0], bins=2)
    assert svg.count("<rect") == 2 and "<title>2</title>" in svg and svg.count("<title>2<") == 2
