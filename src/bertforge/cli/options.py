"""The one option system of every command: a typed dataclass turned into a jsonargparse parser.

:func:`parse_config` builds the parser from the dataclass (one ``--field_name`` per field, dotted
``--section.field`` for nested dataclasses, the field's docstring, type, default and choices in
``--help``), adds ``--config FILE`` (YAML or JSON holding any of the options) and
``--print_config``, parses, and returns the dataclass instance, so its ``__post_init__`` is the
one place a value is checked. Usage errors become a one-line :class:`BertforgeError`.

Before parsing, the command line is brought to that spelling:

- ``--input a.txt b.txt`` (a list field followed by several values) is passed as one list, as
  ``nargs="+"`` did, and a repeated ``--input c.txt`` adds to it; ``--input '[a.txt, b.txt]'``
  and ``--input+ a.txt`` work as well;
- a bare boolean flag (``--overwrite``) means ``--overwrite true``;
- an option the command does not have is refused before parsing, with the one it most likely
  means (:func:`unknown_option`): a misspelling, another tool's name for it (``--learning_rate``
  -> ``--lr``), an abbreviation (never taken: ``--max_seq_len`` is not ``--max_seq_length``),
  or another command's nesting (``finetune --train.max_time`` -> ``--max_time``);
- the spellings of the argparse commands before 0.2 (``--warmup-ratio``, ``--no-progress``) are
  rewritten to ``--warmup_ratio`` and ``--progress false`` with one deprecation note on stderr;
  they stop working in the next release.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar, Union

from jsonargparse import ActionConfigFile, ArgumentParser, set_parsing_settings

from bertforge.errors import BertforgeError

# field docstrings (the string under each dataclass field) become the --help of the option
set_parsing_settings(docstring_parse_attribute_docstrings=True)

T = TypeVar("T")
# the words a boolean option takes as its value ("null": an optional one's default, as --help shows)
_BOOL_WORDS = {"true", "false", "yes", "no", "1", "0", "on", "off", "null"}


def _unwrap_optional(hint: Any) -> Any:
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def option_kinds(cls: type, prefix: str = "") -> dict[str, str]:
    """``{"--name": "list" | "bool" | "value"}`` for every option of dataclass ``cls`` (nested
    dataclass fields as ``--section.name``)."""
    kinds: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = _unwrap_optional(hints[f.name])
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            kinds.update(option_kinds(hint, f"{name}."))
        elif typing.get_origin(hint) is list:
            kinds[f"--{name}"] = "list"
        elif hint is bool:
            kinds[f"--{name}"] = "bool"
        else:
            kinds[f"--{name}"] = "value"
    return kinds


def literal_choices(cls: type, prefix: str = "") -> dict[str, tuple[Any, ...]]:
    """``{"name": choices}`` for every option of dataclass ``cls`` whose type is a ``Literal`` or
    an optional one (nested dataclass fields as ``section.name``, the parser's dest)."""
    found: dict[str, tuple[Any, ...]] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = _unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(hint):
            found.update(literal_choices(hint, f"{prefix}{f.name}."))
        elif typing.get_origin(hint) is typing.Literal:
            found[f"{prefix}{f.name}"] = typing.get_args(hint)
    return found


def _dash_value(token: str) -> bool:
    """A value that starts with one dash (``-1m``, ``-1GB``, ``-3``), never an option (``--x``)."""
    return token.startswith("-") and not token.startswith("--") and len(token) > 1


def normalize_argv(argv: Sequence[str], kinds: dict[str, str], prog: str) -> list[str]:
    """``argv`` in the spelling the parser takes (see the module docstring); one note on stderr
    names the old spellings it rewrote."""
    out: list[str] = []
    old: list[tuple[str, str]] = []
    lists: dict[str, int] = {}  # list option -> where its values are in ``out``
    i = 0
    while i < len(argv):
        token = str(argv[i])
        i += 1
        flag, eq, value = token.partition("=")
        if not flag.startswith("--") or flag in ("--config", "--print_config", "--help"):
            out.append(token)
            continue
        new = "--" + flag[2:].replace("-", "_")
        negated = new.startswith("--no_") and kinds.get("--" + new[5:]) == "bool"
        if negated:
            new = "--" + new[5:]
        if new != flag and (new in kinds or new.rstrip("+") in kinds):
            old.append((token if not eq else flag, f"{new} false" if negated else new))
        elif new != flag:
            out.append(token)  # unknown: the parser names it
            continue
        kind = kinds.get(new)
        if negated:
            out += [new, "false"]
        elif eq:
            out.append(f"{new}={value}")
        elif kind == "value" and i < len(argv) and _dash_value(str(argv[i])):
            # "--max_time -1m": argparse would take -1m for an option ("expected one argument");
            # joined, the value reaches the config, whose check says what is wrong with it
            out.append(f"{new}={argv[i]}")
            i += 1
        elif kind == "bool" and (i >= len(argv) or str(argv[i]).lower() not in _BOOL_WORDS):
            out += [new, "true"]
        elif kind == "list" and i < len(argv) and not str(argv[i]).startswith(("[", "-")):
            values = []
            while i < len(argv) and not str(argv[i]).startswith("--"):
                values.append(str(argv[i]))
                i += 1
            if new in lists:  # repeated (--input a --input b): one list, as argparse's extend
                at = lists[new]
                out[at] = json.dumps(json.loads(out[at]) + values)
            else:
                lists[new] = len(out) + 1
                out += [new, json.dumps(values)]
        else:
            out.append(new)
    if old:
        spelled = ", ".join(f"{a} -> {b}" for a, b in old)
        print(
            f"note: {prog}: options are now spelled as in every bertforge command ({spelled}); "
            "the old spelling stops working in the next release",
            file=sys.stderr,
        )
    return out


# other tools' names (transformers' Trainer and run_glue, PyTorch habits) for bertforge's options
_SYNONYMS = {
    "learning_rate": "lr",
    "num_train_epochs": "epochs",
    "num_epochs": "epochs",
    "per_device_train_batch_size": "batch_size",
    "train_batch_size": "batch_size",
    "per_device_eval_batch_size": "eval_batch_size",
    "output_dir": "output",
    "out": "output",
    "model_name_or_path": "model",
    "train_file": "train",
    "validation_file": "validation",
    "test_file": "test",
    "max_seq_length": "max_length",
    "max_len": "max_length",
    "seq_len": "max_seq_length",
    "warmup": "warmup_ratio",
    "threads": "num_threads",
}


def unknown_option(flag: str, kinds: dict[str, str]) -> str:
    """The message for ``flag``, which the command does not have (``kinds``: its options),
    naming the option most likely meant."""
    name = flag[2:].replace("-", "_")
    leaf = name.rsplit(".", 1)[-1]
    nested = [k for k in kinds if k.endswith("." + leaf)]
    if "." in name and f"--{leaf}" in kinds:  # another command's nesting of a flat option
        section = name.rsplit(".", 1)[0]
        return (
            f"no --{section} group of options here ({flag} is how another command nests "
            f"it); use --{leaf}"
        )
    target = _SYNONYMS.get(leaf)
    synonyms = [f"--{target}"] + [k for k in kinds if target and k.endswith("." + target)]
    longer = [k for k in kinds if k.startswith(flag) and k != flag]
    if nested and "." not in name:  # a flat spelling of a nested option
        guess = nested
    elif target and (found := [k for k in synonyms if k in kinds]):
        guess = found
    elif longer:
        return (
            f"unknown option {flag} (options are never abbreviated); did you mean "
            f"{' or '.join(sorted(longer)[:3])}?"
        )
    else:
        guess = difflib.get_close_matches(flag, list(kinds), n=3, cutoff=0.75)
    hint = f"; did you mean {' or '.join(guess[:3])}?" if guess else ""
    return f"unknown option {flag}{hint}"


def check_options(argv: Sequence[str], kinds: dict[str, str], prog: str) -> None:
    """Refuse the first ``--option`` of (normalised) ``argv`` that ``prog`` does not have, with
    :func:`unknown_option`'s message; values are skipped, so a text may start with ``--``."""
    sections = {"--" + k[2:].split(".", 1)[0] for k in kinds if "." in k}
    i = 0
    while i < len(argv):
        token = str(argv[i])
        i += 1
        flag, eq, _ = token.partition("=")
        flag = flag.removesuffix("+")
        if not flag.startswith("--") or flag in ("--print_config", "--help"):
            continue
        if flag in kinds or flag in sections or flag == "--config":
            i += 0 if eq else 1  # its value (bool flags were given one by normalize_argv)
            continue
        raise BertforgeError(f"{prog}: {unknown_option(flag, kinds)} (all options: {prog} --help)")


def build_parser(
    cls: type,
    prog: str,
    description: str,
    positional: tuple[str, str] | None = None,
) -> ArgumentParser:
    """The jsonargparse parser of dataclass ``cls``: ``--config``, ``--print_config`` and one
    option per field; ``positional = (field, help)`` takes that list field from the bare words."""
    # never take an abbreviation: --max_seq_len must not silently mean --max_seq_length
    parser = ArgumentParser(
        prog=prog, description=description, exit_on_error=False, allow_abbrev=False
    )
    parser.add_argument(
        "--config",
        action=ActionConfigFile,
        help="YAML or JSON file(s) of options (later ones and the command line override it)",
    )
    skip = set()
    if positional is not None:
        parser.add_argument(positional[0], nargs="*", default=[], help=positional[1])
        skip.add(positional[0])
    parser.add_class_arguments(cls, as_positional=False, skip=skip)
    # jsonargparse shows a Literal's choices ({auto,bf16,fp32}) but an optional one's as its name
    # (--truncation TRUNCATION): show them alike; null, the default, is in the type line
    choices = literal_choices(cls)
    for action in parser._actions:
        if action.dest in choices and action.metavar is None:
            action.metavar = "{" + ",".join(str(c) for c in choices[action.dest]) + "}"
    return parser


_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "text",
    "NoneType": "null",
    "list": "a list",
    "tuple": "a list",
    "dict": "a mapping",
}


def _type_message(message: str) -> str | None:
    """jsonargparse's report of a value of the wrong type (``Parser key "train.max_steps": Does
    not validate against any of the Union subtypes ...``) as ``--train.max_steps takes an integer
    (or null), not 'five'``; None for any other message."""
    head = re.match(r'Parser key "([\w.]+)": (.*)$', message)
    value = re.search(r"(?:Got value|Given value): (.*?)$", message)
    if not head or not value:
        return None
    key, body = head.groups()
    literal = re.match(r"Expected a typing\.Literal\[(.*?)\]\. Got value", body) or re.search(
        r"Union subtypes Subtypes: \[typing\.Literal\[(.*?)\]", body
    )  # an optional Literal (--pooling): its choices are what the user meant, null is the default
    if literal:
        choices = ", ".join(c.strip(" '\"") for c in literal.group(1).split(","))
        return f"--{key} takes one of {choices}, not {value.group(1)!r}"
    subtypes = re.search(r"Subtypes: \[(.*?)\]", body)
    names = re.findall(r"<class '(\w+)'>", subtypes.group(1) if subtypes else body)
    words = [_TYPE_WORDS.get(n, n) for n in dict.fromkeys(names) if n != "NoneType"]
    if not words or any(w.startswith("a list") for w in words):
        return None  # lists have their own message below
    null = " (or null)" if "NoneType" in names else ""
    return f"--{key} takes {' or '.join(words)}{null}, not {value.group(1)!r}"


def _bool_message(message: str, argv: Sequence[str], kinds: dict[str, str]) -> str | None:
    """``unrecognized arguments: maybe`` where ``maybe`` follows a boolean option (``--compile
    maybe``, which :func:`normalize_argv` read as ``--compile true maybe``) as ``--compile takes
    true or false, not 'maybe'``; None for any other message."""
    extra = re.match(r"unrecognized arguments: (\S+)", message)
    if not extra:
        return None
    word = extra.group(1)
    for at in range(2, len(argv)):
        flag = str(argv[at - 2])
        if argv[at] == word and argv[at - 1] == "true" and kinds.get(flag) == "bool":
            return f"{flag} takes true or false, not {word!r}"
    return None


def _one_line(
    err: BaseException, prog: str, argv: Sequence[str], kinds: dict[str, str] | None = None
) -> BertforgeError:
    message = " ".join(str(err).split())
    head = "the following arguments are required: "
    if message.startswith(head):  # jsonargparse names the keys; users type the options
        names = message[len(head) :].split(", ")
        message = head + ", ".join(n if n.startswith("-") else f"--{n}" for n in names)
    sequence = re.match(
        r'Parser key "([\w.]+)": Expected a <class \'(?:tuple|list)\'>\. Got value: (.*)$', message
    )
    if sequence:  # "--train.betas 0.9,0.98": a list option wants brackets, which jsonargparse hides
        key, value = sequence.groups()
        items = ",".join(value.replace(",", " ").split()) or "..."
        message = f"--{key} takes a list: write --{key} '[{items}]', not {value}"
    else:
        message = _type_message(message) or _bool_message(message, argv, kinds or {}) or message
    configs = [v for k, v in zip(argv, argv[1:], strict=False) if k == "--config"]
    where = f" (options from {', '.join(configs)} and the command line)" if configs else ""
    return BertforgeError(f"{prog}: {message}{where}; see {prog} --help")


def parse_config(
    cls: type[T],
    argv: Sequence[str],
    *,
    prog: str,
    description: str,
    positional: tuple[str, str] | None = None,
) -> T:
    """Parse ``argv`` into an instance of dataclass ``cls`` (validated by its ``__post_init__``).

    ``--help`` and ``--print_config`` print and exit (``SystemExit(0)``); a usage error raises
    :class:`BertforgeError` with one line naming the option.
    """
    kinds = option_kinds(cls)
    argv = normalize_argv(argv, kinds, prog)
    check_options(argv, kinds, prog)
    parser = build_parser(cls, prog, description, positional)
    try:
        parsed = parser.parse_args(argv)
    except (argparse.ArgumentError, UnicodeDecodeError) as err:
        raise _one_line(err, prog, argv, kinds) from None
    try:
        namespace = parser.instantiate(parsed)  # nested sections: their __post_init__
        return cls(**{f.name: namespace[f.name] for f in dataclasses.fields(cls)})
    except TypeError:  # a YAML section that is not a mapping (``model: 5``)
        raise BertforgeError(
            f"{prog}: a config section is not a mapping of options (write 'model:' then "
            "indented 'preset: mini', not 'model: 5'); check the --config YAML"
        ) from None
    except BertforgeError as err:  # a value the config refuses, with the fix
        raise BertforgeError(f"{prog}: {err}; see {prog} --help") from None


__all__ = [
    "build_parser",
    "check_options",
    "literal_choices",
    "normalize_argv",
    "option_kinds",
    "parse_config",
    "unknown_option",
]
