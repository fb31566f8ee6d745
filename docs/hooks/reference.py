"""Generated reference pages for the docs site: the CLI from its argparse parsers and the HTTP API from the
platform's OpenAPI document, so that neither can drift from the code.

mkdocs loads this module as a hook (``hooks:`` in mkdocs.yml); ``on_files`` adds ``reference/cli-options.md`` and
``reference/openapi.md`` to the site as generated files, so nothing generated is committed. The OpenAPI document is
the one ``GET /openapi.json`` serves, less the deployed functions' own paths: it is built from the route table
without starting a platform. ``python docs/hooks/reference.py cli|openapi`` prints either page.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

CLI_PAGE = "reference/cli-options.md"
OPENAPI_PAGE = "reference/openapi.md"


def _cell(text: object) -> str:
    """``text`` fit for one cell of a markdown table (no pipes or line breaks; ``<token>`` shown, not taken for
    HTML, outside code spans)."""
    spans = " ".join(str(text).split()).replace("|", "\\|").split("`")
    return "`".join(s if i % 2 else s.replace("<", "&lt;") for i, s in enumerate(spans))


# -- the CLI --------------------------------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """Each sub-parser of ``parser`` with the help line its parent gave it, depth first."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, child in action.choices.items():
            yield name, child, helps.get(name, "")


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    """The table rows of ``parser``'s own arguments (help and sub-command choices left out)."""
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        metavar = action.metavar if isinstance(action.metavar, str) else None
        name = ", ".join(action.option_strings) or (metavar or action.dest)
        if action.option_strings and action.nargs != 0:
            name += f" {metavar or action.dest.upper()}"
        default = action.default
        shown = "" if default in (None, False, argparse.SUPPRESS) or action.nargs == 0 else f"`{default}`"
        rows.append(f"| `{_cell(name)}` | {_cell(action.help or '')} | {shown} |")
    return rows


def _command_sections(parser: argparse.ArgumentParser, path: str, help_line: str) -> Iterator[str]:
    children = list(_subcommands(parser))
    if path:
        yield f"## `{path}`\n"
        if help_line:
            yield f"{help_line[0].upper()}{help_line[1:]}.\n"
        if not children:
            usage = " ".join(parser.format_usage().split()).removeprefix("usage: ")
            yield f"```\n{usage}\n```\n"
        rows = _arguments(parser)
        if rows:
            yield "| argument | what it does | default |\n| --- | --- | --- |\n" + "\n".join(rows) + "\n"
    for name, child, child_help in children:
        yield from _command_sections(child, f"{path} {name}".strip(), child_help)


def cli_markdown() -> str:
    """The page: every ``ember`` command and its arguments, as ``ember COMMAND --help`` shows them."""
    from ember.cli import build_parser

    head = ("# Every command and option\n\nGenerated from the `ember` command's own parsers when the site is built "
            "(`ember COMMAND --help` says the same). What each command does is in [the CLI](cli.md).\n")
    return "\n".join([head, *(f"{s}" for s in _command_sections(build_parser(), "", ""))]).replace("## `", "## `ember ")


# -- the HTTP API ---------------------------------------------------------------------------------------------------


def _schema_name(schema: dict[str, Any]) -> str:
    """A short name for ``schema``: the component it refers to, else its type."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if "anyOf" in schema or "oneOf" in schema:
        return " or ".join(_schema_name(s) for s in schema.get("anyOf", schema.get("oneOf", [])))
    if schema.get("type") == "array":
        return f"array of {_schema_name(schema.get('items', {}))}"
    return f"`{schema.get('type', 'any JSON')}`"


def _content_schema(entry: dict[str, Any]) -> str:
    """The schemas of a request body's or answer's content, per media type."""
    content = entry.get("content", {})
    return "; ".join(f"{media}: {_schema_name(c.get('schema', {}))}" for media, c in content.items()) or "none"


def _operation(path: str, method: str, op: dict[str, Any]) -> Iterator[str]:
    yield f"### `{method.upper()} {path}`\n"
    if op.get("summary"):
        yield _cell(op["summary"]) + "\n"
    if op.get("description"):
        yield op["description"].strip() + "\n"
    params = op.get("parameters", [])
    if params:
        rows = [f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} | "
                f"{_cell(p.get('description', ''))} |" for p in params]
        yield "| parameter | in | required | |\n| --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"
    if "requestBody" in op:
        yield f"Body: {_content_schema(op['requestBody'])}\n"
    answers = [f"| {code} | {_cell(r.get('description', ''))} | {_content_schema(r)} |"
               for code, r in op.get("responses", {}).items()]
    if answers:
        yield "| answer | | body |\n| --- | --- | --- |\n" + "\n".join(answers) + "\n"


def _component(name: str, schema: dict[str, Any]) -> Iterator[str]:
    yield f'### {name} {{ #{name.lower()} }}\n'
    if schema.get("description"):
        yield _cell(schema["description"]) + "\n"
    props = schema.get("properties", {})
    if props:
        required = set(schema.get("required", []))
        rows = [f"| `{field}` | {_schema_name(s)} | {'yes' if field in required else 'no'} | "
                f"{_cell(s.get('description', ''))} |" for field, s in props.items()]
        yield "| field | type | required | |\n| --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"


def openapi_document() -> dict[str, Any]:
    """The document ``GET /openapi.json`` serves, without any deployed function's paths."""
    from ember_platform.gateway.asgi import ROUTES
    from ember_platform.gateway.openapi import static_document

    return static_document(ROUTES)


def openapi_markdown(document: dict[str, Any] | None = None) -> str:
    """The page: every route, its parameters, bodies and answers, then every schema they name."""
    doc = document or openapi_document()
    parts = ["# HTTP API: every route\n",
             f"Generated from the platform's OpenAPI {doc['openapi']} document (`GET /openapi.json`, which also "
             "has one path per deployed function the token sees) when the site is built. "
             "An overview is in [HTTP API](http-api.md).\n",
             _cell(doc["info"].get("description", "")) + "\n", "## Routes\n"]
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            parts.extend(_operation(path, method, op))
    parts.append("## Schemas\n")
    for name, schema in sorted(doc["components"]["schemas"].items()):
        parts.extend(_component(name, schema))
    return "\n".join(parts)


# -- the mkdocs hook ------------------------------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """Adds the generated pages to the site (mkdocs >= 1.6)."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, CLI_PAGE, content=cli_markdown()))
    files.append(File.generated(config, OPENAPI_PAGE, content=openapi_markdown()))
    return files


if __name__ == "__main__":
    print({"cli": cli_markdown, "openapi": openapi_markdown}[sys.argv[1]]())
