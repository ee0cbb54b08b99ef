import dataclasses
import json
import math
import re
import typing
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
import typer
from sae_lens import SAE
from typer.testing import CliRunner

from sae_lens_bae import BAE, BAETrainingSAE
from sae_lens_bae.cli import COMMANDS, app
from sae_lens_bae.cli.options import config_class, config_command, options_of
from sae_lens_bae.entropy.estimate import is_reliable
from sae_lens_bae.experiments.synthetic import GRIDS

runner = CliRunner(env={"COLUMNS": "300"})  # wide enough that rich wraps no message

# what each command needs beyond its defaults (required options)
REQUIRED = {
    ("train",): ["--out", "somewhere", "--dataset", "texts.txt"],
    ("interpret",): ["--records", "records.safetensors"],
    ("dashboard",): ["--records", "records.safetensors"],
    ("entropy", "icl"): ["--dataset", "sentences.tsv"],
    ("steer", "icl"): ["--dataset", "sentences.tsv"],
}
# options that the config only accepts with other required options
INSTEAD = {("interpret",): {"sae": ["--dataset", "texts.txt"]}}
# fields whose generic "other value" would be out of range: lr_end must lie in (0, lr]
VALID = {"lr_end": "0.0001", "grid": "mid"}
IDS = [" ".join(path) for path, *_ in COMMANDS]


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for path, *_ in COMMANDS:
        assert path[0] in result.output


@pytest.mark.parametrize("path", [path for path, *_ in COMMANDS], ids=IDS)
def test_every_command_has_help_with_every_config_field(path):
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    run = next(run for p, run, *_ in COMMANDS if p == path)
    for option in options_of(config_class(run)):
        assert re.search(rf"^  {option.flag}\b", result.output, re.MULTILINE), option.flag


@pytest.mark.parametrize("path", [(), *[path for path, *_ in COMMANDS]], ids=["bae", *IDS])
def test_help_reads_at_80_columns(path):
    """Every line fits 80 columns, and an option's help starts by column 34: the text gets at
    least 46 columns (rich's boxes left it about 20 beside the long option names)."""
    narrow = CliRunner(env={"COLUMNS": "80"})
    result = narrow.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80
    option_lines = [line for line in lines if line.startswith("  --")]
    starts = [re.match(r"  --\S+(?: <\w+>)?\s+", line).end() for line in option_lines]
    assert not starts or max(s for s in starts if s < 80) <= 34
    assert not any(re.search(r"[╭│╰]", line) for line in lines)


@pytest.mark.parametrize(
    "old",
    [["quickstart", "--corpus", "x"], ["train", "--dataset", "x", "--out", "o", "--preset", "a"],
     ["bench", "synthetic", "--ranks", "0,2"], ["bench", "two-token", "--ranks", "0,3"]],
)  # fmt: skip
def test_names_no_release_shipped_are_not_options(old):
    """0.2.0 is the first release: no option keeps a name it had before it."""
    result = CliRunner().invoke(app, old)
    assert result.exit_code == 2 and "No such option" in result.output, result.output


def _recording_app(run):
    """A one-command app built like the real ones, whose run records the config it gets."""
    seen = []

    def record(cfg, progress=True):  # noqa: ARG001
        seen.append(cfg)

    record.__annotations__ = {"cfg": config_class(run), "progress": bool}
    recording = typer.Typer()
    recording.command()(config_command(record, doc="records its config"))
    recording.command("unused")(lambda: None)  # two commands: the first is addressed by name
    return recording, seen


def _other_value(option, cls=None):
    """Command-line text for a valid value of ``option`` other than its default (a path field
    that must exist: a file or folder that ``_paths_here`` makes)."""
    default = option.default
    fields = {f.name: f for f in dataclasses.fields(cls)} if cls is not None else {}
    if option.path[-1] in fields and "exists" in fields[option.path[-1]].metadata:
        return f"a_{fields[option.path[-1]].metadata['exists'][0]}"
    if option.path[-1] in VALID:
        return VALID[option.path[-1]]
    if option.annotation is bool:
        return None  # a flag: --no-x or --x
    if option.parser is not None:
        hint = str(option.help)
        if isinstance(default, str) and "," in default:
            return ",".join(reversed(default.split(",")))
        if "One of: " in hint:
            choices = hint.split("One of: ")[1].rstrip(".").split(", ")
            return next(c for c in choices if c != default)
        if default in ("none", "") or default is None:
            return "1" if "=" not in hint else "a=1"
        if isinstance(default, str) and "=" in default:
            return default + ",extra=1"
        try:
            return str(int(default) + 1)
        except ValueError:
            try:
                return str(float(default) / 2)
            except ValueError:
                return default + "_x"
    if option.annotation is int:
        return str(default + 1)
    if option.annotation is float:
        return str(default / 2 if default else 0.5)
    if option.annotation is Path:
        return "elsewhere"
    return str(default) + "_x"


def _paths_here(folder):
    """The paths the command lines of these tests name, made in ``folder``."""
    for name in ("records.safetensors", "a_file", "a_path"):
        (folder / name).write_bytes(b"")
    (folder / "a_folder").mkdir()


@pytest.mark.parametrize("path", [path for path, *_ in COMMANDS], ids=IDS)
def test_cli_defaults_and_options_are_the_config_fields(path, tmp_path, monkeypatch):
    """Every config field is an option with the config's default, and each option reaches its
    field: the CLI cannot drift from the configs."""
    run = next(run for p, run, *_ in COMMANDS if p == path)
    cls = config_class(run)
    options = options_of(cls)
    monkeypatch.chdir(tmp_path)
    _paths_here(tmp_path)
    # the real command's options are exactly the config's fields
    command = typer.main.get_command(app)
    for part in path:
        command = command.commands[part]
    flags = {name for param in command.params for name in param.opts}
    assert {o.flag for o in options} <= flags, sorted({o.flag for o in options} - flags)
    assert len(command.params) == len(options)

    recording, seen = _recording_app(run)
    required = REQUIRED.get(path, [])
    result = runner.invoke(recording, [cls.__name__.lower(), *required])
    assert result.exit_code == 0, result.output
    values = dict(zip(required[::2], required[1::2], strict=True))
    expected = cls(**{k[2:].replace("-", "_"): _typed(cls, k[2:].replace("-", "_"), v)
                      for k, v in values.items()})  # fmt: skip
    assert seen.pop() == expected  # the defaults of the CLI are the config's

    for option in options:
        text = _other_value(option, cls)
        if text is None:
            default = option.default
            args = [f"--no-{option.flag[2:]}" if default else option.flag]
        else:
            args = [option.flag, text]
        base = INSTEAD.get(path, {}).get(option.path[-1], required)
        result = runner.invoke(recording, [cls.__name__.lower(), *base, *args])
        assert result.exit_code == 0, (option.flag, text, result.output)
        config = seen.pop()
        value = config
        for name in option.path:
            value = getattr(value, name)
        default = expected
        for name in option.path:
            default = getattr(default, name)
        assert value != default, (option.flag, text, value)
        if text is not None:
            parsed = option.parser(text) if option.parser else option.annotation(text)
            assert value == parsed, (option.flag, value, parsed)


def _typed(cls, name, text):
    hint = typing.get_type_hints(cls)[name]
    if typing.get_origin(hint) is not None and typing.get_args(hint) == (Path,):  # a list
        return tuple(Path(part) for part in text.split(","))
    return Path(text) if Path in (hint, *typing.get_args(hint)) else text


def test_every_synthetic_grid_is_a_choice_and_no_other_name_is():
    from sae_lens_bae.experiments.synthetic import SyntheticConfig

    assert all(SyntheticConfig(grid=name).chosen_grid() == GRIDS[name] for name in GRIDS)
    with pytest.raises(ValueError, match="unknown grid 'huge'; choose from"):
        SyntheticConfig(grid="huge")


def test_bad_values_end_with_one_line_and_exit_code_2(tmp_path):
    result = runner.invoke(app, ["entropy", "positions", "--layers", "1,x"])
    assert result.exit_code == 2 and "--layers takes comma-separated values" in result.output
    result = runner.invoke(app, ["compare", "--prior", "later"])
    assert result.exit_code == 2 and "--prior takes one of training, evaluation" in result.output
    result = runner.invoke(
        app, ["bench", "synthetic", "--planted-bits", "100", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert result.output == "Error: planted bits go up to d = 64 in grid 'cpu'\n"
    result = runner.invoke(app, ["compare", "--seeds", "0,0"])
    assert result.exit_code == 2 and "seeds must be distinct, got [0, 0]" in result.output
    result = runner.invoke(app, ["compare", "--families", "bae,sparse"])
    assert result.exit_code == 2 and "unknown families ['sparse']" in result.output
    # usage errors (an unknown option or command, a value of the wrong type) are one line too
    for args, message in ((["quickstart", "--steps", "x"], "Invalid value for '--steps'"),
                          (["quickstart", "--nope", "1"], "No such option: --nope"),
                          (["nosuch"], "No such command 'nosuch'.")):  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and result.output.startswith(f"Error: {message}")
        assert result.output.count("\n") == 1, result.output
    # refused by the config before any model loads or any file is written
    result = runner.invoke(app, ["quickstart", "--steps", "-5", "--out", str(tmp_path / "q")])
    assert result.exit_code == 2 and result.output == "Error: steps must be at least 1, got -5\n"
    assert not (tmp_path / "q").exists()
    noise = tmp_path / "noise.safetensors"
    noise.write_bytes(bytes(range(256)) * 4)
    for command in (["dashboard", "--records", "/etc/passwd", "--out", str(tmp_path / "d")],
                    ["interpret", "--records", str(noise)]):  # fmt: skip
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert result.output.startswith("Error: ") and result.output.count("\n") == 1
        assert "is not a feature records file" in result.output


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
            "--bits-per-feature", "2",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    bae = SAE.load_from_disk(out)
    assert isinstance(bae, BAE) and bae.cfg.bits_per_feature == 2 and bae.cfg.d_in == 32
    assert bae.cfg.metadata.hook_name == "blocks.1.hook_resid_post"


def test_train_compile_hands_the_bae_step_to_torch_compile(
    tiny_hf_llama_dir, tiny_corpus, tmp_path, monkeypatch
):
    """--compile is SAELens' compile_sae: its runner compiles the BAE's training_forward_pass
    (traced here by dynamo's eager backend, so the test does not wait for inductor)."""
    compiled = []
    real_compile = torch.compile

    def recording_compile(fn, **kwargs):
        compiled.append((getattr(fn, "__func__", fn), kwargs.get("backend"), kwargs.get("mode")))
        return real_compile(fn, backend="eager")

    monkeypatch.setattr(torch, "compile", recording_compile)
    out = tmp_path / "bae"
    args = ["train", "--model", str(tiny_hf_llama_dir), "--dataset", str(tiny_corpus),
            "--hook", "blocks.1.hook_resid_post", "--out", str(out), "--context-size", "32",
            "--training-tokens", str(8 * 256), "--batch-size", "256"]  # fmt: skip
    result = runner.invoke(app, [*args, "--compile"])
    assert result.exit_code == 0, result.output
    assert compiled == [(BAETrainingSAE.training_forward_pass, "inductor", None)]
    assert isinstance(SAE.load_from_disk(out), BAE)
    args[args.index(str(out))] = str(tmp_path / "bae-cudagraphs")
    result = runner.invoke(app, [*args, "--compile-mode", "reduce-overhead"])
    assert result.exit_code == 0, result.output  # a mode implies --compile
    assert compiled[1] == (BAETrainingSAE.training_forward_pass, "inductor", "reduce-overhead")
    result = runner.invoke(app, [*args, "--compile-mode", "reduce-overhead", "--distributed"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--compile does not combine with --distributed" in result.output
    assert len(compiled) == 2  # refused before any model ran


def test_train_with_unknown_hook_fails_clearly(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    result = runner.invoke(app, result_args(tiny_hf_llama_dir, tiny_corpus, tmp_path))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "Unknown hook name(s) ['blocks.7.hook_resid_post']" in result.output
    debug = runner.invoke(app, ["--debug", *result_args(tiny_hf_llama_dir, tiny_corpus, tmp_path)])
    assert isinstance(debug.exception, ValueError)  # --debug: the exception and its traceback


def result_args(model, corpus, out):
    return ["train", "--model", str(model), "--dataset", str(corpus),
            "--hook", "blocks.7.hook_resid_post", "--out", str(out)]  # fmt: skip


def _bad_inputs(model, corpus, tmp):
    """(arguments, what the error line says) for every kind of bad input, over the commands."""
    (tmp / "empty.txt").write_text("")
    (tmp / "one_label.tsv").write_text("label\tsentence\n1\tw5 w6\n1\tw7 w8\n")
    (tmp / "broken").mkdir()
    (tmp / "broken" / "cfg.json").write_text("{ not json")
    (tmp / "a_file").write_text("x")
    (tmp / "foreign").mkdir()
    (tmp / "foreign" / "cfg.json").write_text('{"architecture": "martian", "d_in": 3}')
    (tmp / "other_grid").mkdir()
    (tmp / "other_grid" / "synthetic.json").write_text('{"preset": {"d": 3}, "results": []}')
    m, c = ["--model", str(model)], ["--dataset", str(corpus)]
    return [
        (["quickstart", *m, "--dataset", str(tmp / "missing.txt")], "No such file or folder"),
        (["compare", *m, "--dataset", str(tmp / "empty.txt")], "holds no text"),
        (["compare", "--model", str(tmp / "nowhere"), *c], "Cannot load a model"),
        (["compare", "--model", "no-such-model", *c], "unknown model name 'no-such-model'"),
        (["compress", *m, *c, "--layer", "9"], "Layers [9] do not exist"),
        (["interpret", "--sae", str(tmp / "broken"), *c, *m], "is not valid JSON"),
        (["interpret", "--sae", str(tmp), *c, *m], "No cfg.json in"),
        (["interpret", "--records", str(tmp / "none.safetensors")], "records: no file"),
        (["interpret", "--llm", "x"], "pass either --records FILE or --sae FOLDER"),
        (["entropy", "icl", *m, "--dataset", str(tmp / "one_label.tsv")], "single label"),
        (
            [
                "entropy",
                "positions",
                *m,
                *c,
                "--layers",
                "1",
                "--max-log2-position",
                "1",
                "--n-sequences",
                "8",
                "--bae-batch-size",
                "8",
                "--steps",
                "2",
                "--out",
                str(tmp / "a_file"),
            ],
            "File exists",
        ),  # an output folder that cannot be made
        (["bench", "synthetic", "--planted-bits", "100"], "planted bits go up to d = 64"),
        (["bench", "synthetic", "--drain-hold", "-1"], "drain_hold must be at least 0"),
        (["bench", "synthetic", "--grid", "test", "--out", str(tmp / "other_grid")],
         "holds the results of another grid or recipe; use another --out"),
        (["bench", "two-token", "--words", "yes"], "exactly two words"),
        (["compress", "--thresholds", "-2"], "thresholds must be in [-1.0, 0.0]"),
        (["steer", "icl", "--dataset", "x", "--baselines", "transcoder"], "choose among"),
        (["train", *m, *c, "--hook", "blocks.1.hook_resid_post", "--out", str(tmp / "run"),
          "--resume", str(tmp / "run")], "nothing to resume from"),
        (["train", *m, *c, "--hook", "blocks.1.hook_resid_post", "--out", str(tmp / "run"),
          "--resume", str(tmp / "broken")], "no complete checkpoint under"),
        (["interpret", "--sae", str(tmp / "foreign"), *c, *m], "names the architecture 'martian'"),
        (["dashboard", "--records", str(tmp / "none.safetensors")], "records: no file"),
    ]  # fmt: skip


def test_bad_input_matrix_ends_with_one_line_and_exit_code_2(tiny_hf_llama_dir, tiny_corpus,
                                                             tmp_path):  # fmt: skip
    for args, message in _bad_inputs(tiny_hf_llama_dir, tiny_corpus, tmp_path):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output, args
        errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1 and message in errors[0], (args, result.output)


def test_an_interrupted_write_leaves_the_previous_file(tmp_path, monkeypatch):
    from pathlib import Path as P

    from sae_lens_bae.reports import write_json

    target = tmp_path / "summary.json"
    write_json(target, {"run": 1})
    real = P.write_text

    def disk_full(self, text, *args, **kwargs):  # noqa: ARG001
        real(self, text[: len(text) // 2])  # half the bytes reach the disk, then it is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(P, "write_text", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_json(target, {"run": 2, "rows": list(range(100))})
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"run": 1}  # untouched, and no partial file left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


@pytest.mark.slow
def test_quickstart_pipeline_on_tiny_model(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    out = tmp_path / "report"
    result = runner.invoke(
        app,
        ["quickstart", "--model", str(tiny_hf_llama_dir), "--dataset", str(tiny_corpus),
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
    bae = metrics["models"]["bae"]
    assert bae["entropy_estimate_bits"] > 0
    assert bae["entropy_ceiling_bits"] == pytest.approx(math.log2(bae["distinct_states"]))
    assert bae["distinct_states"] <= metrics["held_out_tokens"]
    assert bae["entropy_reliable"] == is_reliable(
        bae["entropy_estimate_bits"], bae["entropy_ceiling_bits"], bae["relative_error"],
        bae["entropy_excess_bits"], typical_error=bae["typical_relative_error"],
    )  # fmt: skip
    report = (out / "report.md").read_text()
    assert "| dense features" in report and "![training curves]" in report
    assert "| CE loss recovered, spliced into the model |" in report
    # CE recovered and KL: the saved models spliced into the model on the held-out rows
    from sae_lens_bae.activations import ActivationCache
    from sae_lens_bae.evaluation import spliced_losses
    from sae_lens_bae.models import load_model

    tokens = ActivationCache.load(out / "activations").tokens()
    n_held_out = max(1, round(0.1 * tokens.shape[0]))
    saved = {name: SAE.load_from_disk(out / name) for name in ("bae", "topk")}
    expected = spliced_losses(load_model(str(tiny_hf_llama_dir)), saved,
                              tokens[-n_held_out:][:32], metrics["hook"])  # fmt: skip
    for name in ("bae", "topk"):
        for key in ("ce_loss_score", "kl_div_with_sae", "ce_loss_with_sae"):
            assert metrics["models"][name][key] == pytest.approx(expected[name][key], rel=1e-5)
    for png in ("training_curves.png", "firing_frequency.png"):
        image = matplotlib.image.imread(out / png)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    # the columns it shares with bae compare: what compare's reader gives the same models
    from sae_lens_bae.activations import LayerActivations, outlier_mask
    from sae_lens_bae.experiments.compare_read import read_split, split_metrics

    cache = ActivationCache.load(out / "activations")
    first = tokens.shape[0] - n_held_out
    acts = cache.activations(metrics["hook"])
    keep = outlier_mask(acts, 10.0)  # one rule over every row, as harvest_layer drops them
    rows = cache.token_positions()[keep]
    held = rows[:, 0] >= first
    assert int(held.sum()) == metrics["held_out_tokens"]
    assert int((~held).sum()) == metrics["train_tokens"]
    assert int((~keep).sum()) == metrics["outliers_dropped"]
    data = LayerActivations(
        hook=metrics["hook"], train={}, test={metrics["hook"]: acts[keep][held]},
        scales={metrics["hook"]: 1.0}, positions=rows[held],
        token_ids=tokens[rows[held][:, 0], rows[held][:, 1]],
        sequences=tokens, tokenizer=None, model="tiny", dataset="tiny", outliers_dropped=0,
    )  # fmt: skip
    for name in ("bae", "topk"):
        sums, _ = read_split(saved[name], data, records_k=10, prior_source="evaluation")
        read = split_metrics(sums, np.ones((1, len(sums.tokens))), n_explain=5)
        ours = metrics["models"][name]
        for key in ("dead", "dense", "constant", "l0", "explained_variance"):
            assert ours[key] == pytest.approx(read[key][0], rel=1e-5), (name, key)
    headline = "**Entropy of the held-out hidden states"
    assert (headline in report) == bae["entropy_reliable"]
    assert ("No entropy headline" in report) == (not bae["entropy_reliable"])


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
         "--words", "w5,w6", "--planted-bits", "0,2", "--n-samples", "64", *quick,
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
    assert result.exit_code == 2 and "thresholds must be in [-1.0, 0.0], got -2.0" in result.output
    result = runner.invoke(app, ["bench", "more-bits", *common, "--bits-per-feature", "1,2",
                                 "--out", str(tmp_path / "m")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (
        json.loads((tmp_path / "m" / "more_bits.json").read_text())["rows"][1]["bits_per_feature"]
        == 2
    )
    result = runner.invoke(app, ["steer", "icl", "--dataset", "x", "--baselines", "transcoder"])
    assert result.exit_code == 2 and "baselines ['transcoder']: choose among" in result.output


# Every option of the hand-written CLI this one replaced (sae-lens-bae before the experiments
# package): each name still exists and parses its own default (the defaults themselves are the
# configs', tested above).
TRACE = (
    "expansion",
    "bae_batch_size",
    "batch_size",
    "device",
    "seed",
    "out",
    "hook",
    "lr",
    "steps",
)
"""Options every entropy trace had."""
PREVIOUS_OPTIONS = {
    ("quickstart",): (
        "out",
        "model",
        "layer",
        "dataset",
        "text_column",
        "steps",
        "context_size",
        "max_sequences",
        "device",
    ),
    ("train",): (
        "model",
        "hook",
        "text_column",
        "context_size",
        "training_tokens",
        "batch_size",
        "lr",
        "expansion",
        "bits_per_feature",
        "entropy_coefficient",
        "covariance_coefficient",
        "surrogate_temperature",
        "normalize_activations",
        "wandb",
        "wandb_project",
        "device",
        "seed",
    ),
    ("compare",): (
        "dataset",
        "model",
        "layer",
        "text_column",
        "context_size",
        "max_sequences",
        "steps",
        "prior",
        "records_k",
        "device",
        "out",
        "comsem_llm",
        "comsem_base_url",
        "comsem_max_features",
    ),
    ("interpret",): (
        "records",
        "sae",
        "dataset",
        "hook",
        "sentences",
        "context_size",
        "k",
        "magnitude",
        "input_scale",
        "base_url",
        "llm",
        "api_key",
        "model",
        "out",
        "cache",
        "concurrency",
        "max_features",
        "n_explain",
        "n_test",
        "detection",
        "calibrate",
        "batch_api",
        "price_input",
        "price_output",
        "templates",
        "top",
    ),
    ("bench", "synthetic"): (
        "grid",
        "out",
        "steps",
        "planted_bits",
        "expansions",
        "seeds",
        "ablation",
        "resume",
        "device",
    ),
    ("bench", "two-token"): (
        "model",
        "layer",
        "hook",
        "words",
        "planted_bits",
        "n_samples",
        "expansion",
        "steps",
        "bae_batch_size",
        "lr",
        "device",
        "seed",
        "out",
    ),
    ("bench", "more-bits"): (
        "dataset",
        "model",
        "layer",
        "bits_per_feature",
        "expansion",
        "steps",
        "max_sequences",
        "context_size",
        "comsem_llm",
        "comsem_base_url",
        "comsem_max_features",
        "device",
        "seed",
        "out",
    ),
    ("compress",): (
        "dataset",
        "model",
        "layer",
        "thresholds",
        "expansion",
        "steps",
        "max_sequences",
        "context_size",
        "device",
        "seed",
        "out",
    ),
    ("entropy", "positions"): (
        "model",
        "dataset",
        "text_column",
        "layers",
        "max_log2_position",
        "n_sequences",
        *TRACE,
    ),
    ("entropy", "icl"): (
        "model",
        "split",
        "text_column",
        "label_column",
        "label_words",
        "layers",
        "shots",
        "n_prompts",
        "max_sentence_words",
        *TRACE,
    ),
    ("steer", "icl"): (
        "model",
        "layer",
        "hook",
        "split",
        "text_column",
        "label_column",
        "label_words",
        "shots",
        "vector_prompts",
        "eval_prompts",
        "top",
        "baselines",
        "strengths",
        "normalise",
        "steps",
        "expansion",
        "device",
        "seed",
        "out",
    ),
}


@pytest.mark.parametrize("path", list(PREVIOUS_OPTIONS), ids=" ".join)
def test_previous_options_keep_their_names(path):
    run = next(run for p, run, *_ in COMMANDS if p == path)
    options = {o.name: o for o in options_of(config_class(run))}
    for name in PREVIOUS_OPTIONS[path]:
        option = options[name]  # KeyError: an option a user's script passes was removed
        if option.parser is not None and isinstance(option.default, str):
            option.parser(option.default)
