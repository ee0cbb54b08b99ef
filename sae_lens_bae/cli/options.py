"""Typer commands built from config dataclasses: every field an option, nothing copied by hand.

A command's options are its config's fields: ``--field-name`` with the field's default and its
docstring (or comment) as help. A nested dataclass field (an ``EntropyRecipe``, an ``ICLTemplate``)
contributes its own fields as options, with its default instance's values as defaults; the field's
metadata ``{"cli_names": {"batch_size": "bae_batch_size"}}`` renames nested options that would
clash with the outer config's. Values that typer does not parse natively come as text:
comma-separated lists (``--layers 5,15,25``), ``key=value`` pairs (``--label-words
0=negative,1=positive``), a Literal's choices, and ``none`` for an optional field whose default is
not None. A config that rejects the values (its ``__post_init__`` raises ``ValueError``) ends the
command with one line and exit code 2, as a bad option does.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, Union

import typer
from simple_parsing.docstring import get_attribute_docstring

from sae_lens_bae.comsem import ComSemAPIError

__all__ = [
    "DEBUG",
    "USER_ERRORS",
    "Option",
    "build_config",
    "config_class",
    "config_command",
    "fail",
    "format_default",
    "options_of",
]


@dataclass(frozen=True)
class Option:
    """One command-line option: where its value goes in the config and how it is read."""

    path: tuple[str, ...]
    """Field path in the config: ("steps",) or ("recipe", "batch_size")."""
    name: str
    """Python name of the parameter: the option is ``--`` + name with ``-`` for ``_``."""
    annotation: Any
    """What typer parses the text as (``str`` when ``parser`` converts it)."""
    default: Any
    """The config's default, in the form typer is given it (``...``: required)."""
    help: str
    parser: Callable[[Any], Any] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def typer_option(self) -> Any:
        decls = [f"{self.flag}/--no-{self.flag[2:]}" if self.annotation is bool else self.flag]
        kwargs: dict[str, Any] = {
            "help": self.help,
            "show_default": True,
        }
        if self.parser is not None:
            kwargs["parser"] = self.parser
        return typer.Option(self.default, *decls, **kwargs)


def _optional(hint: Any) -> tuple[Any, bool]:
    """(inner type, True) for ``X | None``, else (hint, False)."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def _help(cls: type, name: str) -> str:
    doc = get_attribute_docstring(cls, name)
    text = doc.docstring_below or doc.comment_inline or doc.comment_above
    return " ".join((text or doc.desc_from_cls_docstring or "").split())


def format_default(value: Any) -> Any:
    """A default as typer is given it: sequences as ``a,b,c``, dicts as ``k=v,...``."""
    if isinstance(value, Mapping):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, Sequence) and not isinstance(value, str):
        return ",".join(str(v) for v in value)
    return value


def _scalar_reader(kind: Any, flag: str) -> Callable[[str], Any]:
    """Text -> one value of ``kind`` (int, float, str, Path or a Literal's choices)."""
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)

        def choice(text: str) -> Any:
            for value in choices:
                if str(value) == text:
                    return value
            raise ValueError(f"{flag} takes one of {', '.join(map(str, choices))}, got {text!r}")

        return choice
    if kind in (int, float, str, Path):

        def scalar(text: str) -> Any:
            try:
                return kind(text)
            except ValueError:
                raise ValueError(f"{flag} takes {kind.__name__} values, got {text!r}") from None

        return scalar
    raise TypeError(f"{flag}: no command-line form for {kind!r}")


def _literal_value(text: str) -> Any:
    """A ``key=value`` value of a ``dict[str, Any]`` field: a Python literal, else the text."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _reader(hint: Any, optional: bool, flag: str) -> tuple[Any, Callable[[Any], Any] | None]:
    """(annotation for typer, parser or None) of a field type."""
    origin = typing.get_origin(hint)
    if origin in (list, tuple, Sequence, typing.Sequence) or hint in (list, tuple):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis] or [str]
        one = _scalar_reader(args[0], flag)

        def items(text: Any) -> Any:
            if not isinstance(text, str):
                return text
            if optional and text.lower() == "none":
                return None
            try:
                return tuple(one(part.strip()) for part in text.split(",") if part.strip())
            except ValueError as e:
                raise ValueError(f"{flag} takes comma-separated values: {e}") from None

        return str, items
    if origin in (dict, Mapping, typing.Mapping) or hint is dict:
        value_type = (typing.get_args(hint) or (str, str))[1]
        read_value = str if value_type is str else _literal_value

        def pairs(text: Any) -> Any:
            if not isinstance(text, str):
                return text
            if optional and text.lower() == "none":
                return None
            result = {}
            for item in (part.strip() for part in text.split(",") if part.strip()):
                key, sep, value = item.partition("=")
                if not sep or not key.strip():
                    raise ValueError(
                        f"{flag} takes comma-separated key=value pairs such as "
                        f"'0=negative,1=positive', got {text!r}"
                    )
                result[key.strip()] = read_value(value.strip())
            return result

        return str, pairs
    if hint is bool:
        return bool, None
    if typing.get_origin(hint) is Literal or optional:
        one = _scalar_reader(hint, flag)

        def scalar_or_none(text: Any) -> Any:
            if not isinstance(text, str):
                return text
            return None if optional and text.lower() == "none" else one(text)

        return str, scalar_or_none
    _scalar_reader(hint, flag)  # raises for an unsupported type
    return hint, None


def options_of(
    cls: type,
    default: Any = None,
    path: tuple[str, ...] = (),
    names: Mapping[str, str] | None = None,
) -> list[Option]:
    """The options of config class ``cls`` (fields of nested dataclasses flattened). ``default``
    is the instance whose values are the defaults (nested configs); ``names`` renames fields."""
    hints = typing.get_type_hints(cls)
    options: list[Option] = []
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        if default is not None:
            value = getattr(default, field.name)
        elif field.default is not MISSING:
            value = field.default
        elif field.default_factory is not MISSING:
            value = field.default_factory()
        else:
            value = ...
        hint, optional = _optional(hints[field.name])
        if dataclasses.is_dataclass(hint):
            if optional:
                raise TypeError(f"{cls.__name__}.{field.name}: a nested config cannot be None")
            nested_names = field.metadata.get("cli_names", {})
            options += options_of(hint, value, (*path, field.name), nested_names)
            continue
        name = (names or {}).get(field.name, field.name)
        flag = "--" + name.replace("_", "-")
        annotation, parser = _reader(hint, optional, flag)
        help_text = _help(cls, field.name)
        if typing.get_origin(hint) is Literal:
            help_text += f" One of: {', '.join(map(str, typing.get_args(hint)))}."
        if parser is not None and value is not ...:
            value = "none" if value is None and annotation is str and optional else value
            value = format_default(value)
        options.append(
            Option((*path, field.name), name, annotation, value, help_text.strip(), parser)
        )
    seen: dict[str, Option] = {}
    for option in options:
        if option.name in seen:
            raise TypeError(
                f"{cls.__name__}: options {seen[option.name].path} and {option.path} are both "
                f"{option.flag}; rename one with the nested field's metadata 'cli_names'"
            )
        seen[option.name] = option
    return options


def build_config(cls: type, options: Sequence[Option], values: Mapping[str, Any]) -> Any:
    """The config for parsed option ``values`` (keyed by option name); a nested config (at any
    depth) is built from the values of its own fields."""
    tree: dict[str, Any] = {}
    for option in options:
        value = values[option.name]
        if option.parser is not None:
            value = option.parser(value)
        *parents, name = option.path
        node = tree
        for parent in parents:
            node = node.setdefault(parent, {})
        node[name] = value
    return _build(cls, tree)


def _build(cls: type, tree: Mapping[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    values = dict(tree)
    for name, value in tree.items():
        if dataclasses.is_dataclass(hints[name]):  # a nested config: its fields' values
            values[name] = _build(hints[name], value)
    return cls(**values)


USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    OSError,
    ModuleNotFoundError,
    ComSemAPIError,
)
"""What bad input raises (a missing file, a wrong option value, an unwritable folder, a full disk,
a missing optional package, a refused API request): one line and exit code 2 on the command line.
``--debug`` shows the traceback instead. Everything else is a bug and keeps its traceback."""


@dataclass
class _Debug:
    on: bool = False


DEBUG = _Debug()
"""Set by the app's ``--debug`` option."""


def fail(error: BaseException) -> NoReturn:
    """End the command with ``Error: <what was wrong>`` on one line and exit code 2."""
    message = " ".join(str(error).split()) or type(error).__name__
    if (
        isinstance(error, FileNotFoundError)
        and error.filename
        and str(error.filename) not in message
    ):
        message = f"{message}: {error.filename}"
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code=2)


def config_class(run: Callable[..., Any]) -> type:
    """The config class a run function takes: the type of its first parameter."""
    first = next(iter(inspect.signature(run).parameters))
    return typing.get_type_hints(run)[first]


def config_command(
    run: Callable[..., Any],
    *,
    doc: str,
    after: Callable[[Any, Any], None] | None = None,
) -> Callable[..., None]:
    """A typer command function whose options are the fields of the config ``run`` takes; it
    builds the config and calls ``run(config)``, then ``after(config, result)``."""
    config_cls = config_class(run)
    options = options_of(config_cls)

    def command(**values: Any) -> None:
        try:
            config = build_config(config_cls, options, values)
        except (ValueError, FileNotFoundError) as e:  # a value out of range, a path to nothing
            fail(e)
        try:
            result = run(config)
        except USER_ERRORS as e:
            if DEBUG.on:
                raise
            fail(e)
        if after is not None:
            after(config, result)

    parameters = [
        inspect.Parameter(
            o.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=o.typer_option(),
            annotation=o.annotation,
        )
        for o in options
    ]
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {o.name: o.annotation for o in options}
    command.__doc__ = doc
    command.__name__ = config_cls.__name__
    return command
