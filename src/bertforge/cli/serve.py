"""``bertforge serve --model DIR [--model NAME=DIR ...]``: load the models once and serve them
over HTTP with uvicorn (an ASGI server: FastAPI's standard companion, one process, asyncio)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bertforge.errors import ArgumentParser, BertforgeError
from bertforge.serve.config import ServeConfig, parse_model_spec
from bertforge.serve.models import load_served_model


def _number(kind: type, minimum: float) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number >= {minimum:g}")
        return value

    return parse


def build_parser() -> ArgumentParser:
    """The options: one per :class:`ServeConfig` field, help from the field's docstring."""
    import ast
    import inspect

    # the field docstrings of ServeConfig are its documentation: show them as --help
    tree = ast.parse(inspect.getsource(ServeConfig))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {
        a.target.id: " ".join(b.value.value.split())
        for a, b in zip(body, body[1:], strict=False)
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr)
    }
    parser = ArgumentParser(
        prog="bertforge serve",
        description="Serve models over HTTP: a JSON API (/docs) and an explorer page (/).",
    )
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="[NAME=]DIR",
        help=docs["models"] + " Repeat to serve several models.",
    )
    defaults = ServeConfig()
    for name, value in vars(defaults).items():
        if name == "models":
            continue
        kind = type(value)
        option = "--" + name.replace("_", "-")
        if kind is str:
            parser.add_argument(option, default=value, metavar="X", help=docs.get(name))
        else:
            parser.add_argument(
                option,
                type=_number(kind, 1 if kind is int else 0.001),
                default=value,
                metavar="N",
                help=f"{docs.get(name)} (default {value})",
            )
    return parser


def parse_config(argv: list[str]) -> ServeConfig:
    args = vars(build_parser().parse_args(argv))
    specs = args.pop("model")
    models: dict[str, str] = {}
    for spec in specs:
        name, directory = parse_model_spec(spec)
        if name in models:
            raise BertforgeError(f"--model: the name {name!r} is given twice; name them NAME=DIR")
        models[name] = directory
    return ServeConfig(models=models, **args)


def main(argv: list[str]) -> int:
    """``bertforge serve``: load every model, then serve until interrupted."""
    config = parse_config(argv)
    try:
        import uvicorn

        from bertforge.serve.app import create_app
        from bertforge.serve.protocol import timed_protocol
    except ImportError as err:
        raise BertforgeError(
            f"bertforge serve needs the serve extra ({err.name} is missing): "
            "pip install 'bertforge[serve]'"
        ) from err

    models = {}
    for name, directory in config.models.items():
        served = load_served_model(name, directory, config.device, config.precision)
        models[name] = served
        print(
            f"{name}: {served.kind} from {directory} ({served.options['precision']})",
            file=sys.stderr,
        )
    app = create_app(config, models)
    uvicorn_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        http=timed_protocol(config.request_timeout),
        timeout_keep_alive=5,
        log_level="warning",
        access_log=False,
    )
    server = uvicorn.Server(uvicorn_config)
    print(
        f"serving on http://{config.host}:{config.port} (page at /, API docs at /docs)",
        file=sys.stderr,
        flush=True,
    )
    server.run()
    return 0


__all__ = ["build_parser", "main", "parse_config"]
