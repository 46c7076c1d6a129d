"""Text corpora for offline calibration (GateSight labels, TriAttention query statistics).

A corpus path is a directory whose subdirectories are named corpora (the name is used for
leave-one-corpus-out evaluation), or a directory / single file of documents forming one corpus.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import KvbenchError

TEXT_SUFFIXES = (".txt", ".md", ".text")
JSON_TEXT_KEYS = ("text", "content", "document", "body")


@dataclass(frozen=True)
class Document:
    """One text document of a corpus. ``doc_id`` is unique within the corpus."""

    corpus: str
    doc_id: str
    text: str

    @property
    def key(self) -> str:
        """A file-name-safe unique key."""
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", self.doc_id)[:80].strip("._") or "doc"
        return f"{safe}-{hashlib.sha256(self.doc_id.encode()).hexdigest()[:8]}"


def _json_text(obj) -> str | None:
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        for key in JSON_TEXT_KEYS:
            if isinstance(obj.get(key), str):
                return obj[key]
    return None


def _file_docs(corpus: str, path: Path, rel: str) -> Iterator[Document]:
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            yield Document(corpus, rel, text)
    elif suffix == ".jsonl":
        for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                text = _json_text(json.loads(line))
            except json.JSONDecodeError as exc:
                raise KvbenchError(f"{path}:{line_no} is not valid JSON ({exc})") from None
            if text is None:
                raise KvbenchError(f"{path}:{line_no} has no text field (one of {', '.join(JSON_TEXT_KEYS)})")
            if text.strip():
                yield Document(corpus, f"{rel}:{line_no}", text)
    elif suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        items = data if isinstance(data, list) else [data]
        for j, obj in enumerate(items):
            text = _json_text(obj)
            if text is None:
                raise KvbenchError(f"{path}[{j}] has no text field (one of {', '.join(JSON_TEXT_KEYS)})")
            if text.strip():
                yield Document(corpus, f"{rel}[{j}]", text)


def _is_doc_file(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() in (*TEXT_SUFFIXES, ".jsonl", ".json") and not p.name.startswith(".")


def read_corpus(path: str | Path) -> list[Document]:
    """Documents under ``path``.

    Each subdirectory of ``path`` is one corpus (its name is the corpus name, used for leave-one-corpus-out);
    document files directly in ``path`` (or ``path`` itself, if a file) form a corpus named after ``path``.
    Files: ``.txt``/``.md``/``.text`` (one document each), ``.jsonl`` (one per line: a string or an object with
    a ``text``/``content``/``document``/``body`` field), ``.json`` (a list of those). Sorted, deterministic.
    """
    path = Path(path)
    if not path.exists():
        raise KvbenchError(f"corpus {path} does not exist")
    docs: list[Document] = []
    if path.is_file():
        docs.extend(_file_docs(path.stem, path, path.name))
    else:
        for p in sorted(path.iterdir()):
            if p.is_dir() and not p.name.startswith("."):
                for f in sorted(x for x in p.rglob("*") if _is_doc_file(x)):
                    docs.extend(_file_docs(p.name, f, f.relative_to(p).as_posix()))
            elif _is_doc_file(p):
                docs.extend(_file_docs(path.name, p, p.name))
    if not docs:
        raise KvbenchError(
            f"no documents under {path}: expected subdirectories (one per corpus) of .txt/.md/.jsonl/.json files"
        )
    return docs


def round_robin(docs: Sequence[Document]) -> list[Document]:
    """``docs`` interleaved across corpora: the first document of every corpus, then every second one, ….

    Corpora take turns in the order of their first document (for :func:`read_corpus`: sorted by name), and
    each keeps its own document order; a corpus that runs out drops out of the rotation. A consumer that stops
    after a token budget (TriAttention's calibration) then sees every corpus kind, not only the first one.
    """
    queues: dict[str, list[Document]] = {}
    for doc in docs:
        queues.setdefault(doc.corpus, []).append(doc)
    rounds = max((len(q) for q in queues.values()), default=0)
    return [q[i] for i in range(rounds) for q in queues.values() if i < len(q)]
