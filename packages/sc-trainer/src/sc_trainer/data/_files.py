"""Reading prompt rows from data files: verl's parquet files and JSON-lines files
(:func:`load_rows`).

A row is one prompt, a dict with verl's keys (``data_source``, ``prompt``, ``ability``,
``reward_model``, ``extra_info``); the files are read in the order given and their rows
concatenated. The suffix decides the format: ``.parquet`` through pyarrow, ``.jsonl`` and
``.json`` as JSON lines (one JSON object per line, blank lines skipped).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeAlias

import pyarrow.parquet as pq

from .._errors import DatasetError, DatasetNotFoundError

__all__ = ["DataFiles", "Origin", "load_rows", "read_files", "short"]

logger = logging.getLogger(__name__)

#: one data file or several, as a path each
DataFiles: TypeAlias = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
#: where a row came from: the file and the row's index in that file
Origin: TypeAlias = tuple[str, int]

_PARQUET = (".parquet",)
_JSON_LINES = (".jsonl", ".json")


def short(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_rows(files: DataFiles, *, prompt_key: str = "prompt") -> list[dict[str, Any]]:
    """The rows of ``files`` (one path or several, concatenated in order), one dict each.

    Raises :class:`DatasetNotFoundError` for a file that does not exist and
    :class:`DatasetError` for a file with another suffix, one that cannot be read, one
    without ``prompt_key`` (in any of its rows, for JSON lines) or one that holds no rows.
    """
    return read_files(files, prompt_key=prompt_key)[0]


def read_files(
    files: DataFiles, *, prompt_key: str = "prompt"
) -> tuple[list[dict[str, Any]], list[Origin]]:
    """:func:`load_rows`, and where each row came from (file, row in the file)."""
    paths = _paths(files)
    rows: list[dict[str, Any]] = []
    origins: list[Origin] = []
    for path in paths:
        found = _read_one(path, prompt_key)
        rows.extend(found)
        origins.extend((str(path), i) for i in range(len(found)))
        logger.info("read %d rows from %s", len(found), path)
    return rows, origins


def _paths(files: DataFiles) -> list[Path]:
    listed = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    if not listed:
        raise DatasetError("no data file given (an empty list of files)")
    paths: list[Path] = []
    for item in listed:
        if not isinstance(item, (str, os.PathLike)):
            raise DatasetError(f"a data file must be a path, got {short(item)}")
        path = Path(item)
        if not path.exists():
            raise DatasetNotFoundError(f"{path}: no such data file")
        if path.suffix.lower() not in _PARQUET + _JSON_LINES:
            raise DatasetError(
                f"{path}: unknown data file format {path.suffix!r}; a data file is "
                f"parquet ({', '.join(_PARQUET)}) or JSON lines ({', '.join(_JSON_LINES)})"
            )
        paths.append(path)
    return paths


def _read_one(path: Path, prompt_key: str) -> list[dict[str, Any]]:
    if path.suffix.lower() in _PARQUET:
        rows = _read_parquet(path, prompt_key)
    else:
        rows = _read_json_lines(path, prompt_key)
    if not rows:
        raise DatasetError(f"{path}: the data file holds no rows")
    return rows


def _read_parquet(path: Path, prompt_key: str) -> list[dict[str, Any]]:
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for a bad file
        raise DatasetError(f"{path}: cannot read the parquet file: {exc}") from exc
    columns = list(table.column_names)
    if prompt_key not in columns:
        raise DatasetError(
            f"{path}: no prompt column {prompt_key!r} (data.prompt_key); "
            f"the file has the columns {columns}"
        )
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def _read_json_lines(path: Path, prompt_key: str) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read the JSON-lines file: {exc}") from exc
    rows: list[dict[str, Any]] = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path} line {line_number} (row {len(rows)})"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not valid JSON ({exc}): {short(line)}") from exc
        if not isinstance(row, dict):
            raise DatasetError(f"{where}: a row must be a JSON object, got {short(row)}")
        if prompt_key not in row:
            raise DatasetError(
                f"{where}: no prompt column {prompt_key!r} (data.prompt_key); "
                f"the row has the columns {sorted(row)}"
            )
        rows.append(row)
    return rows
