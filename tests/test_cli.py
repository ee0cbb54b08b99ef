import json

import matplotlib.image
from sae_lens import SAE
from typer.testing import CliRunner

from sae_lens_bae import BAE
from sae_lens_bae.cli import app

runner = CliRunner()


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "quickstart" in result.output and "train" in result.output


def test_train_live_from_local_model(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    out = tmp_path / "bae"
    result = runner.invoke(
        app,
        [
            "train",
            "--model", str(tiny_hf_llama_dir),
            "--dataset", str(tiny_corpus),
            "--hook", "blocks.1.hook_resid_post",
            "--out", str(out),
            "--context-size", "32",
            "--training-tokens", str(20 * 256),
            "--batch-size", "256",
            "--bits", "2",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    bae = SAE.load_from_disk(out)
    assert isinstance(bae, BAE) and bae.cfg.bits == 2 and bae.cfg.d_in == 32
    assert bae.cfg.metadata.hook_name == "blocks.1.hook_resid_post"


def test_train_with_unknown_hook_fails_clearly(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    result = runner.invoke(
        app,
        ["train", "--model", str(tiny_hf_llama_dir), "--dataset", str(tiny_corpus),
         "--hook", "blocks.7.hook_resid_post", "--out", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code != 0
    assert "Unknown hook name(s) ['blocks.7.hook_resid_post']" in str(result.exception)


def test_quickstart_pipeline_on_tiny_model(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    out = tmp_path / "report"
    result = runner.invoke(
        app,
        ["quickstart", "--model", str(tiny_hf_llama_dir), "--corpus", str(tiny_corpus),
         "--steps", "30", "--context-size", "32", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert str(out / "report.md") in result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["hook"] == "blocks.1.hook_resid_post"  # the middle of 2 layers
    for name in ("bae", "topk"):
        model = metrics["models"][name]
        assert set(model) >= {"reconstruction_loss", "entropy_bits", "dead", "dense"}
        assert 0 <= model["dead"] <= model["d_sae"] == 128
        assert isinstance(SAE.load_from_disk(out / name), SAE)
    assert metrics["models"]["bae"]["entropy_estimate_bits"] > 0
    report = (out / "report.md").read_text()
    assert "| dense features" in report and "![training curves]" in report
    for png in ("training_curves.png", "firing_frequency.png"):
        image = matplotlib.image.imread(out / png)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_entropy_and_bench_commands_on_tiny_model(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    result = runner.invoke(app, ["entropy", "--help"])
    assert result.exit_code == 0 and "positions" in result.output and "icl" in result.output
    quick = ["--steps", "20", "--bae-batch-size", "32", "--expansion", "2"]
    result = runner.invoke(
        app,
        ["entropy", "positions", "--model", str(tiny_hf_llama_dir), "--dataset", str(tiny_corpus),
         "--layers", "0,1", "--max-log2-position", "2", "--n-sequences", "64", *quick,
         "--out", str(tmp_path / "pos")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    cells = json.loads((tmp_path / "pos" / "positions.json").read_text())["cells"]
    assert len(cells) == 2 * 3 and "| layer | position | bits |" in result.output
    result = runner.invoke(
        app,
        ["bench", "two-token", "--model", str(tiny_hf_llama_dir), "--layer", "1",
         "--words", "w5,w6", "--ranks", "0,2", "--n-samples", "64", *quick,
         "--out", str(tmp_path / "tt")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (tmp_path / "tt" / "two_token.png").exists()
    result = runner.invoke(app, ["bench", "two-token", "--words", "yes"])
    assert result.exit_code != 0 and "exactly two words" in result.output
    result = runner.invoke(app, ["entropy", "positions", "--layers", "1,x"])
    assert result.exit_code != 0 and "comma-separated" in result.output


def test_entropy_icl_command_on_tiny_model(tiny_hf_llama_dir, tmp_path):
    lines = ["label\tsentence"] + [f"{i % 2}\tw{20 + i} w{40 + i}" for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
    result = runner.invoke(
        app,
        ["entropy", "icl", "--dataset", str(tmp_path), "--model", str(tiny_hf_llama_dir),
         "--label-words", "0=w5,1=w6", "--layers", "1", "--hook", "hook_resid_mid",
         "--shots", "0,2", "--n-prompts", "16", "--steps", "10", "--bae-batch-size", "8",
         "--out", str(tmp_path / "icl")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "icl" / "icl.json").read_text())
    assert saved["config"]["hook"] == "hook_resid_mid" and len(saved["cells"]) == 2
    assert set(saved["accuracy"]) == {"0", "2"}
    result = runner.invoke(
        app, ["entropy", "icl", "--dataset", str(tmp_path), "--label-words", "x"]
    )
    assert result.exit_code != 0 and "0=negative" in result.output


def test_application_commands_on_tiny_model(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    common = ["--model", str(tiny_hf_llama_dir), "--dataset", str(tiny_corpus),
              "--context-size", "32", "--max-sequences", "48", "--steps", "10"]  # fmt: skip
    result = runner.invoke(app, ["compress", *common, "--thresholds", "-1,-0.5",
                                 "--out", str(tmp_path / "c")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "ratio vs fp32" in result.output
    result = runner.invoke(app, ["compress", *common, "--thresholds", "-2"])
    assert result.exit_code != 0 and "outside" in result.output
    result = runner.invoke(app, ["bench", "more-bits", *common, "--bits", "1,2",
                                 "--out", str(tmp_path / "m")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "m" / "more_bits.json").read_text())["rows"][1]["bits"] == 2
    result = runner.invoke(app, ["steer", "icl", "--dataset", "x", "--baselines", "transcoder"])
    assert result.exit_code != 0 and "--baselines" in result.output
