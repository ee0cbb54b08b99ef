"""ComSem end to end: the real ``openai`` client over HTTP against a loopback OpenAI-compatible
server with rule-based answers (sae_lens_bae.comsem.loopback)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import matplotlib.image
import pytest
import torch

from sae_lens_bae.comsem import (
    ChatClient,
    ClientConfig,
    ComSemAPIError,
    ComSemConfig,
    Reply,
    comsem,
    load_templates,
    parse_explanation,
    parse_judgement,
    select_samples,
)
from sae_lens_bae.comsem.loopback import LoopbackServer
from sae_lens_bae.comsem.stages import _calibrated
from sae_lens_bae.experiments import compare
from sae_lens_bae.experiments.compare import CompareConfig
from sae_lens_bae.features.records import FeatureRecords
from sae_lens_bae.models import load_tokenizer

N_FEATURES = 12  # features evaluated per run: keeps each run to ~110 requests


@pytest.fixture(scope="module")
def compare_out(tiny_hf_llama_dir, tiny_corpus, tmp_path_factory) -> Path:
    """bae compare on the tiny model (a BAE and a standard SAE, one setting each) with ComSem
    columns judged by the loopback server; its records feed the other tests."""
    out = tmp_path_factory.mktemp("compare")
    with LoopbackServer() as server:
        cfg = CompareConfig(
            dataset=str(tiny_corpus),
            model=str(tiny_hf_llama_dir),
            context_size=32,
            max_sequences=96,
            families=("bae", "standard"),
            bae_scales=(1.0,),
            l1_coefficients=(5.0,),
            lrs=(1e-3, 2e-3),
            lr_extensions=0,
            ladder_extensions=0,
            seeds=(0,),
            d_sae=64,
            steps=24,
            batch_size=128,
            records_k=4,
            spliced_sequences=2,
            probe_sentences=0,
            out=out,
            comsem_llm="rules",
            comsem_base_url=server.base_url,
            comsem_max_features=4,
        )
        compare.run(cfg, progress=False)
    return out


@pytest.mark.slow
def test_compare_gains_comsem_columns(compare_out):
    summary = json.loads((compare_out / "compare.json").read_text())
    table = (compare_out / "compare.md").read_text()
    assert "| FA | FI | ComSem |" in table
    tested = [row for row in summary["rows"] if row["split"] == "test"]
    assert [row["family"] for row in tested] == ["bae", "standard"]
    for row in tested:
        name = row["name"]
        own = json.loads((compare_out / "comsem" / name / "summary.json").read_text())
        assert row["comsem_score"] == own["mean_score"] and own["evaluated"] <= 4
        assert row["comsem_activated"] == own["activated"] >= row["comsem_interpretable"]
    assert matplotlib.image.imread(compare_out / "comsem_scores.png").shape[0] > 100


@pytest.fixture(scope="module")
def records(compare_out) -> FeatureRecords:
    return FeatureRecords.load(compare_out / "records" / "bae.safetensors")


@pytest.fixture(scope="module")
def tokenizer(records):
    return load_tokenizer(records.info["model"])


def _client(server: LoopbackServer, **kwargs) -> ClientConfig:
    return ClientConfig(model="rules", base_url=server.base_url, retry_wait_min=0.01, **kwargs)


def _config(**kwargs) -> ComSemConfig:
    return ComSemConfig(max_features=N_FEATURES, **kwargs)


def _stable(summary: dict) -> dict:
    """The summary without this run's own usage and the server's address."""
    return {k: v for k, v in summary.items() if k not in ("run", "base_url")}


def _features(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "features.jsonl").read_text().splitlines()]


def test_full_run_on_the_tiny_model_writes_every_output(records, tokenizer, tmp_path):
    assert records.info["model"] and records.magnitude == "burstiness"
    with LoopbackServer() as server:
        summary = comsem(records, tokenizer, _client(server), _config(), out=tmp_path,
                         progress=False)  # fmt: skip
        n_requests = len(server.received)
    features = _features(tmp_path)
    assert summary["evaluated"] == len(features) == N_FEATURES
    assert summary["activated"] == int((records.counts() >= 6).sum()) >= N_FEATURES
    # one explanation per feature, one judgement per test record
    assert n_requests == N_FEATURES + sum(len(f["judgements"]) for f in features)
    for f in features:
        tokens = [s["token"].strip().lower() for s in f["explain_samples"]]
        # the test records: the feature's records after the 5 shown, at most 8
        assert len(tokens) == 5
        assert len(f["judgements"]) == min(int(records.counts()[f["feature"]]), 13) - 5
        # the rule-based explainer names the most common marked token ...
        assert f["explanation"] == f'the word "{Counter(tokens).most_common(1)[0][0]}"'
        # ... and the rule-based judge says Yes exactly for that token
        for j in f["judgements"]:
            assert j["answer"] == (j["sample"]["token"].strip().lower() in f["explanation"])
            assert "<<" in j["sample"]["sentence"] and j["activating"]
        yes = [j["answer"] for j in f["judgements"]]
        assert f["score"] == pytest.approx(sum(yes) / len(yes))
        assert f["interpretable"] == (f["score"] > 0)
    scores = [f["score"] for f in features]
    assert summary["mean_score"] == pytest.approx(sum(scores) / len(scores))
    assert summary["interpretable"] == sum(s > 0 for s in scores)
    assert summary["invalid_explanations"] == summary["invalid_judgements"] == 0
    assert summary["tokens"]["prompt"] > 0 and summary["run"]["requests"] == n_requests
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["mean_score"] == summary["mean_score"]
    table = (tmp_path / "summary.md").read_text()
    assert "| feature | score | explanation |" in table and "FA" in table
    assert matplotlib.image.imread(tmp_path / "scores.png").shape[0] > 100


def test_sae_records_run_too(compare_out, tokenizer, tmp_path):
    raw = FeatureRecords.load(compare_out / "records" / "standard-5-lr0.002-seed0.safetensors")
    assert raw.magnitude == "raw"
    with LoopbackServer() as server:
        summary = comsem(raw, tokenizer, _client(server), ComSemConfig(max_features=3),
                         out=tmp_path, progress=False)  # fmt: skip
    assert summary["magnitude"] == "raw" and summary["evaluated"] == 3


def test_429_and_500_are_retried_and_change_nothing(records, tokenizer, tmp_path):
    with LoopbackServer() as server:
        clean = comsem(records, tokenizer, _client(server), _config(), out=tmp_path / "a",
                       progress=False)  # fmt: skip
    with LoopbackServer(faults=[429, 500, 429, 503]) as server:
        faulty = comsem(records, tokenizer, _client(server), _config(), out=tmp_path / "b",
                        progress=False)  # fmt: skip
        assert len(server.received) == clean["run"]["requests"] + 4
    assert faulty["run"]["retries"] == 4
    assert _stable(faulty) == _stable(clean)


def test_a_refused_request_stops_with_a_clear_error_and_keeps_the_replies(
    records, tokenizer, tmp_path
):
    from sae_lens_bae.comsem import ReplyCache
    from sae_lens_bae.comsem.cache import request_key

    cache = tmp_path / "replies.sqlite"
    with LoopbackServer() as server:  # a first, smaller run fills the cache
        comsem(records, tokenizer, _client(server), ComSemConfig(max_features=2), cache=cache,
               progress=False)  # fmt: skip
    kept = len(ReplyCache(cache))
    with LoopbackServer(faults=[401]) as server:
        client = ChatClient(_client(server, concurrency=1), cache)
        with pytest.raises(ComSemAPIError, match="HTTP 401.*API key"):
            comsem(records, tokenizer, client, _config(), progress=False)
        received = [request_key(body) for body in server.received]
    reread = ReplyCache(cache)
    assert len(reread) == kept > 0
    assert all(reread.get(key) is None for key in received)  # cached replies were not asked again
    with LoopbackServer() as server:  # a wrong base URL: the server answers 404
        wrong = ClientConfig(model="rules", base_url=server.base_url + "/nowhere")
        with pytest.raises(ComSemAPIError, match="HTTP 404.*base URL"):
            comsem(records, tokenizer, ChatClient(wrong, None), _config(), progress=False)
    with LoopbackServer(faults=[500] * 3) as server:
        client = ChatClient(_client(server, max_attempts=3, concurrency=1), None)
        with pytest.raises(ComSemAPIError, match="after 3 attempts"):
            comsem(records, tokenizer, client, _config(), progress=False)


def test_invalid_replies_are_reported_never_counted_as_no(records, tokenizer, tmp_path):
    with LoopbackServer(invalid_every=4) as server:
        summary = comsem(records, tokenizer, _client(server), _config(), out=tmp_path,
                         progress=False)  # fmt: skip
        invalid_sent = sum(
            1 for body in server.received if int(_key(body), 16) % 4 == 0
        )  # what the server made invalid
    features = _features(tmp_path)
    bad_explanations = [f for f in features if f["explanation"] is None]
    bad_judgements = [j for f in features for j in f["judgements"] if j["answer"] is None]
    assert summary["invalid_explanations"] == len(bad_explanations)
    assert summary["invalid_judgements"] == len(bad_judgements)
    assert len(bad_explanations) + len(bad_judgements) == invalid_sent > 0
    for f in bad_explanations:
        assert f["score"] is None and f["judgements"] == []
    for j in bad_judgements:
        assert j["reply"] == "Maybe"
    for f in features:
        valid = [j["answer"] for j in f["judgements"] if j["answer"] is not None]
        if valid:
            assert f["score"] == pytest.approx(sum(valid) / len(valid))


def _key(body: dict) -> str:
    from sae_lens_bae.comsem.loopback import _key as server_key

    return server_key(body)


def test_a_second_run_makes_no_requests(records, tokenizer, tmp_path):
    with LoopbackServer() as server:
        first = comsem(records, tokenizer, _client(server), _config(), out=tmp_path,
                       progress=False)  # fmt: skip
        sent = len(server.received)
        second = comsem(records, tokenizer, _client(server), _config(), out=tmp_path,
                        progress=False)  # fmt: skip
        assert len(server.received) == sent
    assert second["run"]["requests"] == 0 and second["run"]["cache_hits"] == sent
    assert _stable(second) == _stable(first)


@pytest.mark.slow
def test_killed_and_resumed_run_pays_nothing_twice(records, compare_out, tokenizer, tmp_path):
    with LoopbackServer() as server:
        reference = comsem(records, tokenizer, _client(server), _config(),
                           out=tmp_path / "reference", progress=False)  # fmt: skip
    bae = Path(sys.executable).parent / "bae"
    out = tmp_path / "resumed"
    hold = 30
    with LoopbackServer(hold_after=hold) as server:
        command = [
            str(bae), "interpret", "--records", str(compare_out / "records" / "bae.safetensors"),
            "--base-url", server.base_url, "--llm", "rules", "--out", str(out),
            "--max-features", str(N_FEATURES), "--concurrency", "4",
        ]  # fmt: skip
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        from sae_lens_bae.comsem import ReplyCache

        deadline, db = time.time() + 120, out / "replies.sqlite"
        while time.time() < deadline:  # every answered reply must be in the cache before the kill
            if db.exists() and len(ReplyCache(db)) >= hold:
                break
            assert process.poll() is None, process.stdout.read().decode()
            time.sleep(0.2)
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert len(server.answered) == hold
        server.hold_after = None
        server.release()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        answered = server.answered
    assert len(answered) == len(set(answered)) == reference["run"]["requests"]
    resumed = json.loads((out / "summary.json").read_text())
    assert _stable(resumed)["mean_score"] == reference["mean_score"]
    assert {k: v for k, v in _stable(resumed).items() if k != "config"} == {
        k: v for k, v in _stable(reference).items() if k != "config"
    }


def test_batch_api_gives_the_same_summary_at_half_price(records, tokenizer, tmp_path):
    prices = {"price_input": 1.0, "price_output": 4.0}
    with LoopbackServer() as server:
        direct = comsem(records, tokenizer, _client(server, **prices), _config(),
                        out=tmp_path / "direct", progress=False)  # fmt: skip
    with LoopbackServer(batch_polls=2) as server:
        config = _client(server, batch_api=True, batch_poll_seconds=0.01, **prices)
        batched = comsem(records, tokenizer, config, _config(), out=tmp_path / "batch",
                         progress=False)  # fmt: skip
        assert server.received == []  # no direct chat request at all
        assert len(server.batches) == 2  # one job per stage: explain, judge
    assert _stable(batched) == _stable(direct)
    assert batched["run"]["cost_usd"] == pytest.approx(0.5 * direct["cost_usd"])
    assert batched["run"]["cache_hits"] == 0 and batched["run"]["requests"] > 0


def test_detection_mixes_in_non_activating_records(records, tokenizer, tmp_path):
    items = select_samples(records, tokenizer, negatives=True, max_features=N_FEATURES)
    for item in items:  # negatives drawn from the off tokens sampled from the full codes
        assert len(item.negatives) == len(item.test)
        for sample in item.negatives:
            assert records.surely_off(item.feature)[sample.index]
    with LoopbackServer() as server:
        summary = comsem(records, tokenizer, _client(server), _config(detection=True),
                         out=tmp_path, progress=False)  # fmt: skip
    features = _features(tmp_path)
    for f in features:
        positive = [j["answer"] for j in f["judgements"] if j["activating"]]
        negative = [j["answer"] for j in f["judgements"] if not j["activating"]]
        assert len(negative) == len(positive)
        rejected = sum(not a for a in negative) / len(negative)
        expected = (sum(positive) / len(positive) + rejected) / 2
        assert f["balanced_accuracy"] == pytest.approx(expected)
    scored = [f["balanced_accuracy"] for f in features if f["balanced_accuracy"] is not None]
    assert summary["detection_scored"] == len(scored)
    assert summary["mean_balanced_accuracy"] == pytest.approx(sum(scored) / len(scored))


class _DigitTokenizer:
    def decode(self, ids, skip_special_tokens=False):  # noqa: ARG002
        return " ".join(str(i) for i in ids)


def _records(features: list[list[int]]) -> FeatureRecords:
    n = len(features)
    return FeatureRecords(
        features=torch.tensor(features),
        magnitudes=torch.ones(n, len(features[0])),
        token_positions=torch.stack([torch.zeros(n, dtype=torch.long), torch.arange(n)], -1),
        token_ids=torch.arange(n),
        d_sae=2,
        magnitude="burstiness",
        sequences=torch.arange(n)[None],
    )


def test_a_feature_without_sure_negatives_gets_no_detection_score():
    """Feature 0 is on tokens 0-19 and surely off on 20-39 (their records have an empty slot);
    feature 1 is on every token, so it has no sure negative: it keeps its samples but gets none,
    and when no feature has negatives the detection score cannot be had at all."""
    records = _records([[0, 1]] * 20 + [[1, -1]] * 20)
    first, second = select_samples(records, _DigitTokenizer(), negatives=True)
    assert [s.index for s in first.test + first.explain if s.index >= 20] == []
    assert len(first.negatives) == 8 and all(s.index >= 20 for s in first.negatives)
    assert len({s.index for s in first.negatives}) == 8
    assert len(second.test) == 8 and second.negatives == []
    with pytest.raises(ValueError, match="none of the 1 features has 8 tokens"):
        select_samples(records, _DigitTokenizer(), negatives=True, features=[1])


def test_calibration_divides_out_the_content_free_bias(records, tokenizer, tmp_path):
    biased = Reply(text="Yes", top_logprobs={"Yes": -0.511, "No": -0.916})  # P 0.6 / 0.4
    assert _calibrated(biased, prior=(0.5, 0.5)) is True
    assert _calibrated(biased, prior=(0.8, 0.2)) is False  # 0.6/0.8 < 0.4/0.2
    with pytest.raises(ComSemAPIError, match="logprobs"):
        _calibrated(Reply(text="Yes"), prior=(0.5, 0.5))
    with LoopbackServer() as server:
        summary = comsem(records, tokenizer, _client(server), _config(calibrate=True),
                         out=tmp_path, progress=False)  # fmt: skip
        content_free = [b for b in server.received if "N/A" in b["messages"][-1]["content"]]
        assert len(content_free) == summary["explained"]
        assert all(b["logprobs"] for b in server.received if "Description" in str(b))


def test_reply_parsing_and_templates(tmp_path):
    templates = load_templates()
    assert parse_explanation("Bodies of water.", templates) == "Bodies of water"
    assert parse_explanation('"past-tense verbs"', templates) == "past-tense verbs"
    assert parse_explanation('Description: the word "bank"', templates) == 'the word "bank"'
    for bad in (None, "", "words", "Subword tokens", "a\nb", " ".join(["long"] * 13)):
        assert parse_explanation(bad, templates) is None
    assert parse_judgement(" Yes.") is True and parse_judgement("no") is False
    assert parse_judgement("Yes, because") is None and parse_judgement(None) is None
    custom = tmp_path / "templates"
    custom.mkdir()
    explain = json.loads(json.dumps(templates.explain))
    explain["system"] = "CUSTOM INSTRUCTION"
    (custom / "explain.json").write_text(json.dumps(explain))
    overridden = load_templates(custom)
    assert overridden.explain_messages([])[0]["content"] == "CUSTOM INSTRUCTION"
    assert overridden.judge == templates.judge  # judge.json not overridden
    (custom / "judge.json").write_text('{"system": "x"}')
    with pytest.raises(ValueError, match="is not a ComSem template"):
        load_templates(custom)
    with pytest.raises(FileNotFoundError):
        load_templates(tmp_path / "missing")


def test_interpret_a_saved_sae_on_text(compare_out, tiny_hf_llama_dir, tiny_corpus, tmp_path):
    from typer.testing import CliRunner

    from sae_lens_bae.cli import app

    compare = json.loads((compare_out / "compare.json").read_text())
    with LoopbackServer() as server:
        result = CliRunner().invoke(
            app,
            [
                "interpret", "--sae", str(compare_out / "models" / "bae"),
                "--dataset", str(tiny_corpus), "--model", str(tiny_hf_llama_dir),
                "--hook", compare["hook"],  # compare's models read the states as harvested
                "--sentences", "40", "--context-size", "32", "--k", "4",
                "--base-url", server.base_url, "--llm", "rules", "--max-features", "3",
                "--out", str(tmp_path),
            ],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    made = FeatureRecords.load(tmp_path / "records.safetensors")
    assert made.magnitude == "burstiness" and made.features.shape[1] == 4
    assert made.info == {"hook": compare["hook"], "model": str(tiny_hf_llama_dir)}
    assert json.loads((tmp_path / "summary.json").read_text())["evaluated"] == 3
    result = CliRunner().invoke(app, ["interpret", "--llm", "rules"])
    assert result.exit_code != 0 and "either --records" in result.output


class _SmallTokenizer(_DigitTokenizer):
    def __len__(self) -> int:
        return 30


def test_records_of_another_tokenizer_are_refused():
    records = _records([[0, 1]] * 40)  # token ids 0..39
    records.info["model"] = "model-a"
    with pytest.raises(ValueError, match="token id 39, beyond this tokenizer's 30 tokens: they "
                       "were made with another model \\(model-a\\)"):  # fmt: skip
        select_samples(records, _SmallTokenizer())
    assert len(select_samples(_records([[0, 1]] * 30), _SmallTokenizer())) == 2


def test_the_estimate_counts_the_requests_a_run_sends(records, tokenizer, tmp_path):
    from sae_lens_bae.comsem.estimate import CHARS_PER_TOKEN, estimate_run

    config = _config(detection=True)
    with LoopbackServer() as server:
        client = _client(server, price_input=2.0, price_output=8.0, max_tokens=20)
        estimate = estimate_run(records, tokenizer, client, config)
        summary = comsem(records, tokenizer, client, config, out=tmp_path, progress=False)
        sent = len(server.received)
    assert estimate.features == summary["evaluated"] == N_FEATURES
    assert estimate.requests == sent  # every explanation parsed: every judgement was asked
    assert estimate.completion_tokens == 20 * sent
    assert estimate.cost_usd == pytest.approx(
        (estimate.prompt_tokens * 2.0 + estimate.completion_tokens * 8.0) / 1e6)  # fmt: skip
    # the prompts' characters, counted as the client would send them, at 4 a token
    chars = sum(len(m["content"]) for body in server.received for m in body["messages"])
    placeholders = len(" ".join(["word"] * 8))  # the judge's explanation is not known yet
    judged = sent - N_FEATURES
    expected = chars + judged * placeholders - sum(
        len(f["explanation"]) * len(f["judgements"]) for f in _features(tmp_path))  # fmt: skip
    assert estimate.prompt_tokens == round(expected / CHARS_PER_TOKEN)


def test_a_paid_run_needs_a_yes(tmp_path, compare_out):
    from typer.testing import CliRunner

    from sae_lens_bae.cli import app

    path = compare_out / "records" / "bae.safetensors"
    with LoopbackServer() as server:
        args = [
            "interpret",
            "--records",
            str(path),
            "--base-url",
            server.base_url,
            "--llm",
            "rules",
            "--max-features",
            "2",
            "--price-input",
            "0.15",
            "--out",
            str(tmp_path),
        ]
        refused = CliRunner().invoke(app, args)
        assert refused.exit_code == 2 and len(server.received) == 0
        assert "Error: a paid ComSem run starts only once confirmed" in refused.output
        assert "ComSem on 2 features:" in refused.output and "estimated cost $" in refused.output
        done = CliRunner().invoke(app, [*args, "--yes"])
    assert done.exit_code == 0, done.output


def test_comsem_runs_inside_a_running_event_loop(records, tokenizer):
    """A Jupyter kernel runs an event loop: comsem() there gives the summary asyncio.run gives."""
    import asyncio

    with LoopbackServer() as server:
        plain = comsem(records, tokenizer, _client(server), _config(), progress=False)

        async def in_a_loop():  # as a notebook cell runs
            return comsem(records, tokenizer, _client(server), _config(), progress=False)

        inside = asyncio.run(in_a_loop())
    assert _stable(inside) == _stable(plain)
    assert inside["evaluated"] == N_FEATURES
