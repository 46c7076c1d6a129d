"""Model fingerprints read from a checkpoint's files, never from its loaded weights (so an engine that loads the
checkpoint itself, vLLM, can name an 80B model's weights without a 160 GB CPU copy).

:func:`checkpoint_fingerprint` is SHA-256 over: the format tag :data:`FORMAT` and the dtype the weights are loaded
in; the config (as :func:`kvbench.models.fingerprint` hashes it: without where-from keys and rope aliases, so
transformers 5.19 and 5.24 agree); each weight file's name, its safetensors header table (every tensor's name,
dtype and shape) and the SHA-256 of its bytes; and the tokenizer's vocabulary and chat template. A file's bytes
are read in :data:`CHUNK` pieces (the memory does not grow with the file), and not at all for a file in the
Hugging Face cache, whose blob is named by that SHA-256. The result is cached per checkpoint files and dtype
(:func:`cached`), so each checkpoint is read once.

Fingerprints of the earlier definition (a strided sample of the loaded weights, kvbench before issue 65) are
mapped to these by ``scripts/migrate_fingerprints.py``, which rewrote the shipped calibration artifacts.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from pathlib import Path

FORMAT = "kvbench-fingerprint-v2"
CHUNK = 8 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin")
_SHA256_NAME = re.compile(r"[0-9a-f]{64}")


def weight_files(root: Path) -> list[Path]:
    return sorted(f for f in root.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file())


def safetensors_table(path: Path) -> list[list]:
    """``[[name, dtype, shape], …]`` from a safetensors file's header, sorted by name (no tensor is read)."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    return sorted([k, v["dtype"], v["shape"]] for k, v in header.items() if k != "__metadata__")


def file_sha256(path: Path) -> str:
    """SHA-256 of the file's bytes: the Hugging Face cache blob's own name when ``path`` links to one."""
    target = path.resolve()
    if target != path.absolute() and target.parent.name == "blobs" and _SHA256_NAME.fullmatch(target.name):
        return target.name
    h = hashlib.sha256()
    with open(target, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


#: Config keys that say where or with what a model was loaded, not what it is: the same weights loaded from
#: another directory (a fresh clone) or under another transformers patch release keep their fingerprint.
NOT_THE_MODEL = ("_name_or_path", "transformers_version")
#: RoPE settings that some transformers releases also copy to the top level of the config (5.19 does for
#: partial_rotary_factor, 5.24 does not); a top-level copy equal to ``rope_parameters``' value is dropped.
ROPE_ALIASES = ("partial_rotary_factor", "rope_theta")


def canonical_config(config: dict) -> dict:
    """``config`` without where-from keys and without top-level copies of ``rope_parameters`` entries."""
    config = {k: v for k, v in config.items() if k not in NOT_THE_MODEL}
    rope = config.get("rope_parameters") or {}
    for alias in ROPE_ALIASES:
        if alias in config and isinstance(rope, dict) and rope.get(alias) == config[alias]:
            del config[alias]
    return config


def hash_config(h, config: dict) -> None:
    """The config part of every kvbench fingerprint (both definitions)."""
    h.update(json.dumps(canonical_config(config), sort_keys=True, default=str).encode())


def hash_tokenizer(h, tokenizer) -> None:
    """The tokenizer part of every kvbench fingerprint (both definitions): vocabulary and chat template."""
    if tokenizer is not None:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
        h.update(str(getattr(tokenizer, "chat_template", "")).encode())


def checkpoint_fingerprint(root: Path, dtype, config, tokenizer) -> str:
    """The fingerprint of the checkpoint directory ``root`` loaded in ``dtype`` (see the module docstring)."""
    h = hashlib.sha256(f"{FORMAT}:{dtype}".encode())
    hash_config(h, config.to_dict())
    for f in weight_files(root):
        h.update(f.name.encode())
        if f.suffix == ".safetensors":
            h.update(json.dumps(safetensors_table(f)).encode())
        h.update(file_sha256(f).encode())
    hash_tokenizer(h, tokenizer)
    return h.hexdigest()


def checkpoint_key(root: Path, dtype) -> str:
    """What identifies a checkpoint's files cheaply (the fingerprint cache's key): config, tokenizer and template
    bytes, and each weight file's name, size, modification time and first 64 KiB (a safetensors header); any write
    to a weight file changes it, so a stale fingerprint is never reused."""
    h = hashlib.sha256(f"{FORMAT}:{dtype}".encode())
    for f in sorted(root.iterdir()):
        if not f.is_file():
            continue
        if f.suffix in (".json", ".jinja", ".model", ".txt"):
            h.update(f.name.encode() + f.read_bytes())
        elif f.suffix in WEIGHT_SUFFIXES:
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
            with open(f, "rb") as fh:
                h.update(fh.read(1 << 16))
    return h.hexdigest()


def snapshot_dir(name: str) -> Path:
    """The local directory holding hub id ``name``'s config, tokenizer and weight files (the Hugging Face cache's
    snapshot; downloaded there when it is not, as vLLM or transformers would)."""
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.bin", "*.jinja", "*.model", "*.txt"]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=True))
    except Exception:  # noqa: BLE001 - not (completely) in the cache: fetch it
        return Path(snapshot_download(name, allow_patterns=patterns))


def cached(path: str, dtype, config, tokenizer) -> str:
    """:func:`checkpoint_fingerprint` of checkpoint ``path`` (a directory or a hub id), from the kvbench cache when
    these files were fingerprinted before."""
    from kvbench.atomic import write_atomic
    from kvbench.cache import cache_dir

    root = Path(path) if Path(path).is_dir() else snapshot_dir(path)
    target = cache_dir() / "fingerprints" / f"{checkpoint_key(root, dtype)}.json"
    if target.is_file():
        try:
            entry = json.loads(target.read_text())
            if entry.get("format") == FORMAT:
                return str(entry["fingerprint"])
        except (ValueError, KeyError, AttributeError):
            pass  # a damaged entry: recompute it
    sha = checkpoint_fingerprint(root, dtype, config, tokenizer)
    try:
        entry = {"fingerprint": sha, "format": FORMAT, "source": str(path), "dtype": str(dtype)}
        write_atomic(target, json.dumps(entry))
    except OSError:  # a read-only cache only costs reading the files again
        pass
    return sha
