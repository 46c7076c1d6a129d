"""Peak RSS of fingerprinting a large checkpoint from its files (kvbench/checkpoints/files.py), side by side with
the same process doing everything but the fingerprint.

    .venv/bin/python benchmarks/fingerprint_rss.py [--gib 2]

Writes a checkpoint directory in a temporary folder: the shipped tiny-trained's config and tokenizer beside one
``model.safetensors`` of GIB GiB of random float32 values (one tensor; the fingerprint reads headers and file bytes,
not shapes against the config), then runs two child processes, each printing its peak RSS (``ru_maxrss``):
``baseline`` (imports, config and tokenizer, the fingerprint skipped) and ``fingerprint``
(``load_model(..., weights=False)``, which fingerprints the files with a cold cache).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
from kvbench import models
if mode == "baseline":
    models.cached_fingerprint = lambda *a, **k: "skipped"
t0 = time.perf_counter()
lm = models.load_model(path, weights=False)
peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(lm.fingerprint[:16], round(time.perf_counter() - t0, 1), peak_mib)
"""


def write_checkpoint(root: Path, gib: float) -> None:
    from kvbench.models import materialize_builtin

    src = materialize_builtin("tiny-trained")
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy(f, root / f.name)
    n = int(gib * 2**30) // 4
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(root / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        left = 4 * n
        while left:
            chunk = os.urandom(min(left, 64 << 20))
            fh.write(chunk)
            left -= len(chunk)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ckpt"
        root.mkdir()
        write_checkpoint(root, args.gib)
        size = (root / "model.safetensors").stat().st_size
        env = {**os.environ, "KVBENCH_CACHE": str(Path(tmp) / "cache")}
        print(f"checkpoint: {size / 2**30:.2f} GiB of weights")
        for mode in ("baseline", "fingerprint"):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", CHILD, mode, str(root)], env=env, capture_output=True,
                                 text=True, check=True).stdout.split()  # fmt: skip
            print(f"{mode:12s} fingerprint {out[0]}  load_model {out[1]} s  peak RSS {out[2]} MiB "
                  f"(process {time.perf_counter() - t0:.1f} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
