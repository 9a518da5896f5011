"""Reading a manifest file into an ExperimentManifest, with errors that name the
file, the field and the fix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from schemas.manifest import ExperimentManifest
from services.common.errors import ManifestError
from services.common.small_files import FileTooLarge, NotRegularFile, read_small_file
from services.common.validation import field_path, problem_lines

MAX_MANIFEST_BYTES = 1024 * 1024
MAX_MANIFEST_VALUES = 100_000
"""Values a manifest may expand to: YAML aliases can repeat a small text into billions."""
MAX_MANIFEST_DEPTH = 64
"""Nesting a manifest may have (validation, hashing and storage all recurse)."""
MAX_MANIFEST_NODES = 100_000
"""YAML nodes (keys and values) the text may hold; bounds the parse (pure-Python PyYAML
composes ~20,000 nodes a second on a loaded machine; libyaml's composer is faster but
overflows the C stack on deep nesting, so it is not used)."""


class _ManifestLoader(yaml.SafeLoader):
    """PyYAML's safe loader without merge keys and with a node budget.

    Merge keys (``<<``) are refused: PyYAML copies the merged pairs into every
    mapping that uses them *before* duplicate keys collapse, so ten aliases per level
    multiply the work by ten per level (a 600-byte manifest took 10 s and 200 MB)
    and the post-parse value count never sees it. No manifest field needs them.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        node = super().compose_node(parent, index)
        self._nodes += 1
        if self._nodes > MAX_MANIFEST_NODES:
            raise _TooBig(node.start_mark.line + 1 if node is not None else 0)
        return node

    def flatten_mapping(self, node: Any) -> None:
        first_line: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _MergeKey(line)
            if isinstance(key_node, yaml.ScalarNode):
                # PyYAML keeps the last of two equal keys without a word: a manifest
                # with ``agents:`` twice would lose the first list of agents.
                key = (key_node.tag, key_node.value)
                if key in first_line:
                    raise DuplicateKey(key_node.value, line, first_line[key])
                first_line[key] = line
        super().flatten_mapping(node)


class _MergeKey(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


class DuplicateKey(Exception):
    """A mapping gives ``key`` twice (``line``, ``first_line``: where, in YAML)."""

    def __init__(self, key: str, line: int = 0, first_line: int = 0) -> None:
        super().__init__(key)
        self.key, self.line, self.first_line = key, line, first_line


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: an object, or DuplicateKey."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


class _TooBig(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


_MESSAGES = {
    "extra_forbidden": "unknown field (check the spelling; see docs/manifest.md for the fields)",
    "missing": "required field is missing",
}


_NUMERIC = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")
_NUMBER_TYPES = {"int_type": "a valid integer", "float_type": "a valid number"}


def _message(err: ErrorDetails) -> str | None:
    """Our words for an error, or None for pydantic's.

    Manifest fields are strict (schemas.manifest): a number must be written as one.
    The error then says what was written instead, since YAML turns ``yes``/``true``
    into a boolean and a quoted number into text without a word.
    """
    if err["type"] in _NUMBER_TYPES:
        value = err["input"]
        if isinstance(value, bool):
            got = f"{str(value).lower()}, a boolean"
        elif isinstance(value, str):
            got = f"the text {value!r}"
            if _NUMERIC.match(value):
                got += " (write the number without quotes)"
        else:
            got = repr(value)
        return f"Input should be {_NUMBER_TYPES[err['type']]}, got {got}"
    return _MESSAGES.get(err["type"])


def format_validation_error(source: str, exc: ValidationError) -> str:
    """One line per problem: ``<source>: <field>: <message>``."""
    return problem_lines(source, exc, _message)


def _check_size(data: Any, source: str) -> None:
    """Refuse alias bombs and deep nesting before anything walks the data recursively.

    Counts values as the data would be serialized (an alias counts every time it is
    used), stopping at the first limit crossed, so this costs at most the limit.
    """
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(data, ())]
    seen = 0
    while stack:
        value, loc = stack.pop()
        seen += 1
        if len(loc) > MAX_MANIFEST_DEPTH:
            raise ManifestError(
                f"{source}: {field_path(loc[:3])}: nested too deeply "
                f"(more than {MAX_MANIFEST_DEPTH} levels)"
            )
        if seen > MAX_MANIFEST_VALUES:
            raise ManifestError(
                f"{source}: {field_path(loc[:3])}: expands to more than {MAX_MANIFEST_VALUES} "
                "values (YAML anchors and aliases repeated?)"
            )
        if isinstance(value, dict):
            stack.extend((v, (*loc, str(k))) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*loc, i)) for i, v in enumerate(value))


def parse_manifest(data: Any, source: str) -> ExperimentManifest:
    """Validate already-decoded manifest data."""
    if not isinstance(data, dict):
        raise ManifestError(
            f"{source}: the manifest must be a mapping of fields, got {type(data).__name__}"
        )
    _check_size(data, source)
    try:
        return ExperimentManifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(format_validation_error(source, exc)) from None


def parse_manifest_text(text: str, source: str) -> ExperimentManifest:
    """Validate YAML (or JSON, a subset of YAML) manifest text."""
    if len(text.encode()) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{source}: manifest larger than {MAX_MANIFEST_BYTES} bytes")
    loader = _ManifestLoader(text)
    try:
        data = loader.get_single_data()
    except _MergeKey as exc:
        raise ManifestError(
            f"{source}: line {exc.line}: YAML merge keys ('<<') are not allowed in a "
            "manifest; write the fields out (or use a plain alias '*name' for a whole value)"
        ) from None
    except DuplicateKey as exc:
        raise ManifestError(
            f"{source}: line {exc.line}: key {exc.key!r} is given twice in one mapping "
            f"(first at line {exc.first_line}); YAML would keep only the last one, so "
            "write it once"
        ) from None
    except _TooBig as exc:
        raise ManifestError(
            f"{source}: line {exc.line}: more than {MAX_MANIFEST_NODES} YAML nodes "
            "(split the experiment into several manifests)"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ManifestError(f"{source}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise ManifestError(f"{source}: not valid YAML: nested too deeply") from None
    except ValueError as exc:  # an integer beyond Python's digit limit
        raise ManifestError(f"{source}: not valid YAML: {str(exc).split(';')[0]}") from None
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]
    return parse_manifest(data, source)


def load_manifest(path: Path) -> ExperimentManifest:
    """Read and validate a manifest file (a regular file of at most MAX_MANIFEST_BYTES)."""
    try:
        raw = read_small_file(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such manifest file") from None
    except NotRegularFile:
        raise ManifestError(f"{path}: not a regular file (a manifest is a YAML file)") from None
    except FileTooLarge:
        raise ManifestError(f"{path}: manifest larger than {MAX_MANIFEST_BYTES} bytes") from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read manifest: {exc}") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: cannot read manifest: {exc}") from None
    return parse_manifest_text(text, str(path))
