"""Are two results directories' rows the same, timings aside? Pairs the rows of DIR_A and DIR_B by their identity
(``kvbench.rows.IDENTITY``) and prints, per field, in how many pairs it differs; exit 0 when every row has its
pair and only the timing fields (``*_s``) differ, else 1.

Used to check that a refactor leaves behaviour unchanged: run the README's main job at the old and the new commit
(each in its own checkout with its own ``.venv``) and compare, e.g.
``python scripts/compare_rows.py /tmp/mj-old /tmp/mj-new``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvbench.rows import IDENTITY


def load(directory: Path) -> dict[tuple, dict]:
    rows = [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines() if line.strip()]
    keyed = {tuple(json.dumps(r.get(f), sort_keys=True) for f in IDENTITY): r for r in rows}
    if len(keyed) != len(rows):
        raise SystemExit(f"{directory}: {len(rows) - len(keyed)} rows share an identity with another")
    return keyed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args(argv)
    a, b = load(args.a), load(args.b)
    only_a, only_b, common = set(a) - set(b), set(b) - set(a), set(a) & set(b)
    print(f"rows: {len(a)} and {len(b)}; paired {len(common)}; only in A {len(only_a)}; only in B {len(only_b)}")
    differs: dict[str, int] = {}
    for key in common:
        for field in set(a[key]) | set(b[key]):
            if a[key].get(field) != b[key].get(field):
                differs[field] = differs.get(field, 0) + 1
    for field, n in sorted(differs.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {field}: differs in {n} rows" + ("" if field.endswith("_s") else "  <- not a timing"))
    same = not only_a and not only_b and all(f.endswith("_s") for f in differs)
    print("same rows, timings aside" if same else "the rows differ")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
