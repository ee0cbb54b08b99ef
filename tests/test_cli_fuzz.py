"""Every command fuzzed from its config: options drawn from each field's type (numbers negative,
zero, huge, NaN and not numbers; paths empty, missing and not ours; lists and pairs malformed),
the work after validation stubbed out. Every invocation ends with exit 0, or with exit 2 and one
``Error:`` line, never a traceback. ``BAE_FUZZ_EXAMPLES`` raises the number of examples (the
suite runs 300)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sae_lens_bae.cli.options import Option, config_class, options_of

cli = importlib.import_module("sae_lens_bae.cli.app")  # the module; the package exports the app
EXAMPLES = int(os.environ.get("BAE_FUZZ_EXAMPLES", "300"))

WORDS = ["", "x", "none", "-5", "0", "nan", "inf", "1e400", "1,2", "1,,x", "a=b", "=",
         "/etc/passwd", "/nonexistent/folder/file.safetensors", "runs/ü", "1" * 30]  # fmt: skip
"""Text any option may get: empty, not a number, NaN, huge, malformed lists and pairs, files
that are not ours, paths that do not exist."""


def _stub(run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` with its work taken out: it only receives the config the command built."""

    def stub(cfg: Any, progress: bool = True) -> None:  # noqa: ARG001
        return None

    stub.__annotations__ = {"cfg": config_class(run), "progress": bool}
    return stub


APP = cli.build_app(_stub)
COMMANDS = {path: options_of(config_class(run)) for path, run, *_ in cli.COMMANDS}
RUNNER = CliRunner()


def _value(option: Option) -> st.SearchStrategy[list[str]]:
    """The arguments that give ``option`` a value (a flag is given or negated)."""
    if option.annotation is bool:
        name = option.flag.removeprefix("--")
        return st.sampled_from([[f"--{name}"], [f"--no-{name}"]])
    if option.annotation is int:
        text = st.one_of(st.integers(-(10**12), 10**12).map(str), st.sampled_from(WORDS))
    elif option.annotation is float:
        text = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                         st.sampled_from(WORDS))  # fmt: skip
    else:
        text = st.one_of(st.sampled_from(WORDS), st.text(max_size=12))
    return text.map(lambda value: [option.flag, value])


@st.composite
def invocations(draw: st.DrawFn) -> list[str]:
    path = draw(st.sampled_from(sorted(COMMANDS)))
    options = COMMANDS[path]
    chosen = draw(st.lists(st.sampled_from(options), max_size=4, unique_by=lambda o: o.name))
    args = [*path]
    for option in chosen:
        args += draw(_value(option))
    return args


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(invocations())
def test_every_command_ends_with_exit_0_or_one_error_line(args):
    result = RUNNER.invoke(APP, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args,
        result.output,
    )
    assert result.exit_code in (0, 2), (args, result.output)
    if result.exit_code == 2:
        assert result.output.startswith("Error: "), (args, result.output)
        assert result.output.count("\n") == 1, (args, result.output)


def test_the_fuzzer_reaches_every_command_and_every_option():
    """What the strategies draw from: every command of the real app, each with its options."""
    assert set(COMMANDS) == {path for path, *_ in cli.COMMANDS}
    assert all(COMMANDS[path] for path in COMMANDS)  # every command has options to fuzz
