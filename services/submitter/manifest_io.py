"""Reading a manifest file into an ExperimentManifest, with errors that name the
file, the field and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

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
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _MergeKey(key_node.start_mark.line + 1)
        super().flatten_mapping(node)


class _MergeKey(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


class _TooBig(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


_MESSAGES = {
    "extra_forbidden": "unknown field (check the spelling; see docs/manifest.md for the fields)",
    "missing": "required field is missing",
}


def format_validation_error(source: str, exc: ValidationError) -> str:
    """One line per problem: ``<source>: <field>: <message>``."""
    return problem_lines(source, exc, lambda err: _MESSAGES.get(err["type"]))


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
