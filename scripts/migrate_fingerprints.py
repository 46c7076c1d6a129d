"""Migrate stored model fingerprints of the earlier definition (a strided sample of the loaded weights) to the
file-based one (kvbench/checkpoints/files.py), for the checkpoints named.

    python scripts/migrate_fingerprints.py [--model tiny-trained,tiny-trained-dense] [--dtype float32,bfloat16]
        [--dry-run] [PATH ...]

PATH (default: kvbench/builtin/calibration, $KVBENCH_CACHE/calibration, tests/fixtures): files or directories,
walked. Rewritten where they hold an old fingerprint of one of the models: calibration artifacts (the safetensors
metadata, the JSON beside them, and a directory or file named by the fingerprint's first 16 hex digits), GateSight
label manifests (labels.json), results directories (each row's model_fingerprint and, for an artifact this run
rewrote, artifact_sha256; manifest.json's runs) and saved fixtures (.pt dicts with a fingerprint). Each file is
written atomically; running it again changes nothing. Prints the old -> new table and every file it changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
from pathlib import Path


def fingerprint_map(models: list[str], dtypes: list[str]) -> dict[str, str]:
    from kvbench.models import fingerprint, load_model

    table = {}
    for name in models:
        for dtype in dtypes:
            lm = load_model(name, dtype=dtype)
            old = fingerprint(lm.model, lm.tokenizer)
            if old != lm.fingerprint:
                table[old] = lm.fingerprint
            print(f"{name} {dtype}: {old[:16]} -> {lm.fingerprint[:16]}")
    return table


def _kvbench_meta(path: Path) -> tuple[dict, dict] | None:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header_meta = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
    return (header_meta, json.loads(header_meta["kvbench"])) if "kvbench" in header_meta else None


def _renamed(path: Path, table: dict[str, str]) -> Path:
    short = {old[:16]: new[:16] for old, new in table.items()}
    parts = [short.get(p, p) for p in path.parts[:-1]]
    stem = short.get(path.stem, path.stem)
    return Path(*parts, stem + path.suffix)


def migrate(paths: list[Path], table: dict[str, str], dry_run: bool) -> list[str]:
    from safetensors.torch import load_file, save_file

    from kvbench.atomic import write_atomic

    changed, shas = [], {}
    files = sorted({f for p in paths if p.exists() for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()})

    def write(old_path: Path, data: bytes | None, new_path: Path) -> None:
        changed.append(f"{old_path} -> {new_path}" if new_path != old_path else str(old_path))
        if dry_run:
            return
        new_path.parent.mkdir(parents=True, exist_ok=True)
        if data is not None:
            write_atomic(new_path, data)
        if new_path != old_path:
            if data is None:
                os.replace(old_path, new_path)
            else:
                old_path.unlink()

    for f in [f for f in files if f.suffix == ".safetensors"]:
        found = _kvbench_meta(f)
        if found is None or found[1].get("fingerprint") not in table:
            continue
        header_meta, meta = found
        meta["fingerprint"] = table[meta["fingerprint"]]
        tmp = f.with_name(f.name + ".migrating")
        save_file(load_file(f), tmp, metadata={**header_meta, "kvbench": json.dumps(meta, sort_keys=True)})
        data = tmp.read_bytes()
        tmp.unlink()
        shas[hashlib.sha256(f.read_bytes()).hexdigest()] = hashlib.sha256(data).hexdigest()
        write(f, data, _renamed(f, table))
    for f in [f for f in files if f.suffix == ".json"]:
        doc = json.loads(f.read_text())
        if isinstance(doc, dict) and doc.get("fingerprint") in table:
            doc["fingerprint"] = table[doc["fingerprint"]]
        elif isinstance(doc, dict) and any(r.get("model_fingerprint") in table for r in doc.get("runs", [])):
            for r in doc["runs"]:
                r["model_fingerprint"] = table.get(r.get("model_fingerprint"), r.get("model_fingerprint"))
        else:
            if f.parent.name in {o[:16] for o in table} or f.stem in {o[:16] for o in table}:
                write(f, None, _renamed(f, table))  # a file in a migrated artifact's directory
            continue
        write(f, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode(), _renamed(f, table))
    for f in [f for f in files if f.name == "results.jsonl"]:
        from kvbench.results.keys import dumps_row_line

        lines, hit = [], False
        for line in f.read_bytes().splitlines():
            row = json.loads(line)
            if row.get("model_fingerprint") in table:
                hit = True
                row["model_fingerprint"] = table[row["model_fingerprint"]]
                row["artifact_sha256"] = shas.get(row.get("artifact_sha256"), row.get("artifact_sha256"))
            lines.append(dumps_row_line(row).rstrip(b"\n") if hit else line)
        if hit:
            write(f, b"\n".join(lines) + b"\n", f)
    for f in [f for f in files if f.suffix == ".pt"]:
        import torch

        saved = torch.load(f, weights_only=False)
        if isinstance(saved, dict) and saved.get("fingerprint") in table:
            saved["fingerprint"] = table[saved["fingerprint"]]
            tmp = f.with_name(f.name + ".migrating")
            torch.save(saved, tmp)
            data = tmp.read_bytes()
            tmp.unlink()
            write(f, data, f)
    olds = {o[:16] for o in table}
    for d in sorted({p for f in files for p in f.parents if p.name in olds}, key=lambda p: -len(p.parts)):
        if d.is_dir() and not any(d.iterdir()) and not dry_run:
            d.rmdir()  # an artifact directory emptied by its rename
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-trained,tiny-trained-dense")
    parser.add_argument("--dtype", default="float32,bfloat16")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("paths", nargs="*", type=Path)
    args = parser.parse_args()
    from kvbench.cache import cache_dir

    root = Path(__file__).resolve().parent.parent
    paths = args.paths or [root / "kvbench/builtin/calibration", cache_dir() / "calibration", root / "tests/fixtures"]
    table = fingerprint_map(args.model.split(","), args.dtype.split(","))
    for line in migrate(paths, table, args.dry_run):
        print(("would change " if args.dry_run else "changed ") + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
