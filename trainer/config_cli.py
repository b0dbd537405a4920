"""A config dataclass is its command's options (TRL's ``field(metadata={"help": ...})`` + ``TrlParser``, on Typer).

A field's metadata (:func:`cli_meta`): ``help`` (the option's help), and where the option differs from the
field: ``option`` (the parameter name, so the flag is ``--option-name``), ``cli_type`` / ``cli_default``
(what the command line gives; the command turns it into the field's value), ``typer`` (Typer's checks:
``min``, ``max``, ``exists`` ...). ``cli=False`` marks a field that is not an option (e.g. trailing Hydra
overrides). :func:`command_signature` gives a command function one keyword parameter per option, so a
field added to the config is an option without a line in the command (``trainer loop``,
``trainer experiment``). A command whose other parameters are written by hand takes one field's option with
:func:`field_option` (``trainer evaluate``, ``infer``, ``rft``, ``preflight``: the generation settings and the
preflight's size), and a config holds another config's knob under its own name with :func:`field_like`
(``--eval-concurrency`` is ``GenerationSettings.concurrency``): the default, help and checks stay the owner's.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import MISSING
from typing import Any, get_type_hints

import typer


def csv_values(text: str | None) -> tuple[str, ...]:
    """A comma-separated option's values, blanks dropped (``"a, b,"`` → ``("a", "b")``)."""
    return tuple(x.strip() for x in (text or "").split(",") if x.strip())


def cli_meta(
    *,
    help: str,
    option: str | None = None,
    cli_type: Any = None,
    cli_default: Any = MISSING,
    cli: bool = True,
    **typer: Any,
) -> dict[str, Any]:
    """A config field's metadata: its help text and how it appears on the command line."""
    return {
        "help": help,
        "option": option,
        "cli_type": cli_type,
        "cli_default": cli_default,
        "cli": cli,
        "typer": typer,
    }


def option(default: Any, help: str, **meta: Any) -> Any:
    """A config field that is an option: its default, help and :func:`cli_meta`'s other settings."""
    return dataclasses.field(default=default, metadata=cli_meta(help=help, **meta))


def cli_fields(config: type) -> list[dataclasses.Field[Any]]:
    """The fields of ``config`` that are options of its command."""
    return [f for f in dataclasses.fields(config) if f.metadata["cli"]]


def option_name(f: dataclasses.Field[Any]) -> str:
    """The parameter behind a field's option (``--option-name``)."""
    return str(f.metadata["option"] or f.name)


def _field(config: type, name: str) -> dataclasses.Field[Any]:
    (found,) = (f for f in dataclasses.fields(config) if f.name == name)
    return found


def _option(f: dataclasses.Field[Any], help: str | None = None) -> Any:
    """The ``typer.Option`` of a field: its command-line default (required where it has none), help and checks."""
    meta = f.metadata
    default = meta["cli_default"] if meta["cli_default"] is not MISSING else f.default
    if default is MISSING and f.default_factory is not MISSING:
        default = f.default_factory()
    return typer.Option(... if default is MISSING else default, help=help or meta["help"], **meta["typer"])


def options(config: type) -> list[inspect.Parameter]:
    """One keyword parameter per option, as Typer reads a command's signature."""
    hints = get_type_hints(config)
    params = []
    for f in cli_fields(config):
        annotation = f.metadata["cli_type"] or hints[f.name]
        params.append(
            inspect.Parameter(option_name(f), inspect.Parameter.KEYWORD_ONLY, default=_option(f), annotation=annotation)
        )
    return params


def field_option(config: type, name: str, help: str | None = None) -> Any:
    """The option of ``config``'s field ``name`` (its default, help and checks) as the default of a parameter written
    by hand; the parameter's name makes the flag. ``help``: where the command says more than the field."""
    return _option(_field(config, name), help)


def field_like(config: type, name: str, help: str | None = None, **meta: Any) -> Any:
    """A field that is ``config``'s field ``name`` under another name (``eval_concurrency`` is
    ``GenerationSettings.concurrency``): the same default and checks; ``help`` and ``meta`` (:func:`cli_meta`'s
    ``option``, ``cli_type``, ``cli_default``) where its option differs."""
    f = _field(config, name)
    own = f.metadata
    settings = {k: own[k] for k in ("option", "cli_type", "cli_default", "cli")} | meta
    return dataclasses.field(default=f.default, metadata=cli_meta(help=help or own["help"], **settings, **own["typer"]))


def given_values(config: type, given: dict[str, Any]) -> dict[str, Any]:
    """Field name → the value its option was given (still in the command line's form)."""
    return {f.name: given[option_name(f)] for f in cli_fields(config)}


def command_signature(config: type, *leading: inspect.Parameter) -> inspect.Signature:
    """``leading`` parameters (e.g. Typer's context), then the options of ``config``."""
    return inspect.Signature([*leading, *options(config)])


def set_signature(func: Any, signature: inspect.Signature) -> None:
    """Give ``func`` the signature (and annotations) Typer builds the command from."""
    func.__signature__ = signature
    func.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
