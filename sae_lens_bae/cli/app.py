"""The ``bae`` command line: one command per experiment config, plus ``train`` and ``interpret``.

Nothing here names an option: every command's options are its config's fields
(``sae_lens_bae.cli.options``). After a run the command prints its markdown report, if it has one,
and where the results are.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from sae_lens_bae.cli.options import DEBUG, config_command
from sae_lens_bae.comsem import interpret
from sae_lens_bae.dashboard import site
from sae_lens_bae.experiments import EXPERIMENTS, command_help
from sae_lens_bae.training import live

__all__ = ["COMMANDS", "app", "build_app", "click_command", "main"]

GROUPS = {
    "bench": "Benchmarks with known answers.",
    "entropy": (
        "A BAE's code entropy of hidden states, with its trust verdict: your own, or traced "
        "through an LLM."
    ),
    "steer": "Steer an LLM with task vectors from features.",
}

COMMANDS: list[tuple[tuple[str, ...], Callable[..., Any], str | None, str]] = [
    (("train",), live.train_live, None, command_help(live.__doc__ or "")),
    (("interpret",), interpret.interpret, "summary.md", command_help(interpret.__doc__ or "")),
    (("dashboard",), site.dashboard, None, command_help(site.__doc__ or "")),
    *[(e.command, e.run, e.report, e.help) for e in EXPERIMENTS],
]
"""(command path, run function taking the command's config, markdown report printed after the
run, help): the library's tools first, then the experiments."""


def _is(error: BaseException, name: str) -> bool:
    """Whether ``error`` is click's ``name`` exception (typer may carry its own copy of click)."""
    return any(kind.__name__ == name for kind in type(error).__mro__)


class _OneLineErrors(TyperGroup):
    """The root command: a usage error (an unknown option or command, a value of the wrong type)
    ends with ``Error: ...`` on one line and exit code 2, as a value the config refuses does
    (``options.fail``), instead of a usage box; no arguments at all still show the help."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        try:
            result = super().main(*args, standalone_mode=False, **kwargs)
        except Exception as error:
            if not standalone_mode or not (_is(error, "UsageError") or _is(error, "Abort")):
                raise
            usage: Any = error  # click's UsageError: show, exit_code, format_message
            if _is(error, "NoArgsIsHelpError"):
                usage.show()
                sys.exit(usage.exit_code)
            if _is(error, "Abort"):
                typer.echo("Aborted!", err=True)
                sys.exit(1)
            typer.echo(f"Error: {' '.join(usage.format_message().split())}", err=True)
            sys.exit(2)
        if not standalone_mode:
            return result
        sys.exit(result if isinstance(result, int) else 0)


def _options(
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of an error."),
) -> None:
    DEBUG.on = debug


def _report_printer(report: str | None) -> Callable[[Any, Any], None]:
    def after(config: Any, result: Any) -> None:  # noqa: ARG001
        out = getattr(config, "out", None)
        if report is not None and out is not None and (Path(out) / report).exists():
            typer.echo((Path(out) / report).read_text())
        if out is not None:
            typer.echo(f"results in {out}/")

    return after


def build_app(
    runs: Callable[[Callable[..., Any]], Callable[..., Any]] = lambda run: run,
) -> typer.Typer:
    """The ``bae`` app: a command per entry of ``COMMANDS``, each calling ``runs(run)`` (the run
    itself; a test passes a stub that only receives the built config)."""
    root = typer.Typer(
        cls=_OneLineErrors,
        help="Binary Autoencoders (BAE) on TransformerLens models, trained with SAELens.",
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,  # click's own layout: help text gets the width rich gives the flags
    )
    root.callback()(_options)
    groups: dict[str, typer.Typer] = {}
    for name, help_text in GROUPS.items():
        groups[name] = typer.Typer(help=help_text, no_args_is_help=True, rich_markup_mode=None)
        root.add_typer(groups[name], name=name)
    for path, run, report, help_text in COMMANDS:
        parent = root if len(path) == 1 else groups[path[0]]
        command = config_command(runs(run), doc=help_text, after=_report_printer(report))
        parent.command(path[-1], help=help_text)(command)
    return root


app = build_app()
click_command = typer.main.get_command(app)
"""The command line as a click command (what the documentation's CLI reference renders)."""


def main() -> None:
    app()
