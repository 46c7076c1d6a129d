"""A calibration corpus drawn from a shipped model's own training distribution (issue 63; paper §3, §4.2, App. C).

The paper calibrates GateSight (rollout labels, estimator, gate means) and TriAttention (query statistics) on a
sample of the evaluated checkpoint's pretraining distribution: 2,428 Nemotron documents of 750 to 1,250 tokens,
documents that name a long-context benchmark excluded. The embedded models' "pretraining distribution" is the
trainer's row generators (:mod:`kvbench_training.data`) under the mixes of their last training stages
(scripts/train_tiny.sh), so :func:`write_training_corpus` samples those generators:

* each document is one training row of a final-stage mix (stages taken in turn), drawn by
  :func:`kvbench_training.data.training_example` at :data:`ROW_LENGTH` tokens (a row of ``ROW_LENGTH // 2`` to
  ``ROW_LENGTH`` tokens, the length the final stages trained at; the paper's documents are 750-1,250 tokens),
  from a generator of its own namespace (``kvbench-calibration-corpus:<model>:<i>``) whose task seeds fall, as
  every training row's, in ``[TRAIN_SEED_BASE, 2**31)``: never an evaluation seed
  (tests/test_calibration_corpus.py checks every seed the generators were called with against every seed
  kvbench's benches, scripts and tests evaluate with);
* the document text is what the model reads before its first answer, without the chat template's head and
  tail (the label and calibration commands wrap each document in them again): the instruction, the context and
  the first question for a RULER or SCBench row; the needles, chains or text before the first answered value
  for a dense row; its last :data:`DOC_TOKENS` tokens (the paper's longest document), so that the question stays
  in. The rollouts the labels are computed from are then the model's own answers;
* documents are grouped in three sub-corpora by task family (``ruler``, ``scbench``, ``dense``), the unit of
  leave-one-corpus-out evaluation (``kvbench gatesight evaluate``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from kvbench.errors import KvbenchError

from .data import Mix, parse_mix, training_example

#: Row length the documents are drawn at: the final stages' (``--curriculum 4096@0``), so rows of 2,048-4,096
#: tokens. Drawn at the paper's 1,024 instead, the mixes' SCBench kv rows (33-64 pairs) and vt rows do not fit
#: and fall back to lookup rows (7 of 64 documents were SCBench rows, none of them kv).
ROW_LENGTH = 4096
#: A document is the last DOC_TOKENS tokens of what the row shows before its first answer: the paper's longest
#: document (750-1,250 tokens; its longer cohorts are likewise documents truncated to their last N tokens), so the
#: question stays in and the rollouts are the model's answers.
DOC_TOKENS = 1250
#: Documents per shipped model: enough for TriAttention's 32,768 tokens (the paper's "32K tokens"; 2,428 documents
#: for GateSight in the paper, docs/methods.md says why fewer here).
N_DOCS = 28
#: GateSight labels the first N_LABEL_DOCS documents (scripts/calibrate_tiny.sh; the labels' cost on a loaded
#: 2-core machine, docs/methods.md).
N_LABEL_DOCS = 10
#: The mixes of each shipped model's final training stages (scripts/train_tiny.sh; the test checks they are the
#: script's): tiny-trained's 10p, 10q, 10r (exported after 10r), the dense twin's 10p (exported after it).
FINAL_STAGE_MIXES: dict[str, dict[str, str]] = {
    "tiny-trained": {
        "stage10p": "niah_single_1=0.04,niah_multikey_2=0.14,niah_multikey_3=0.1,vt=0.07,fwe=0.07,"
        "scbench_kv64_say=0.12,scbench_kv32_say=0.05,scbench_mf=0.14,scbench_prefix_suffix=0.05,scbench_vt=0.07,"
        "lookup=0.08,echo=0.03,chains=0.04",
        "stage10q": "niah_single_1=0.03,niah_multikey_2=0.2,niah_multikey_3=0.1,vt=0.05,fwe=0.15,"
        "scbench_kv64_say=0.1,scbench_mf=0.12,scbench_prefix_suffix=0.04,scbench_vt=0.05,lookup=0.08,echo=0.03,"
        "chains=0.05",
        "stage10r": "niah_single_1=0.02,niah_multikey_2=0.25,niah_multikey_3=0.08,vt=0.05,fwe=0.2,"
        "scbench_kv64_say=0.1,scbench_mf=0.1,scbench_prefix_suffix=0.03,scbench_vt=0.04,lookup=0.08,echo=0.02,"
        "chains=0.03",
    },
    "tiny-trained-dense": {
        "stage10p": "niah_single_1=0.04,niah_multikey_2=0.13,niah_multikey_3=0.09,vt=0.06,fwe=0.06,"
        "scbench_kv64_say=0.2,scbench_kv32_say=0.05,scbench_mf=0.12,scbench_prefix_suffix=0.04,scbench_vt=0.06,"
        "lookup=0.08,echo=0.03,chains=0.04",
    },
}
#: Sub-corpus (task family) of a row's task.
FAMILIES = ("ruler", "scbench", "dense")
#: The corpus manifest's file name (a dotfile: :func:`kvbench.corpus.read_corpus` skips it)
MANIFEST = ".manifest.json"


def family(task: str) -> str:
    """``scbench`` for an SCBench row (any ``scbench_*``), ``dense`` for a row built by the trainer (recall,
    lookup, echo, chains, repeat), ``ruler`` for a RULER item."""
    from .data import DENSE_TASKS

    if task.startswith("scbench_"):
        return "scbench"
    return "dense" if task in DENSE_TASKS else "ruler"


def final_mixes(model: str) -> dict[str, Mix]:
    """{stage: mix} of ``model``'s final training stages."""
    try:
        return {stage: parse_mix(text) for stage, text in FINAL_STAGE_MIXES[model].items()}
    except KeyError:
        raise KvbenchError(
            f"no training mixes known for model {model!r}; choose one of {sorted(FINAL_STAGE_MIXES)}"
        ) from None


def document_ids(ids: list[int], mask: list[int], head: list[int], tail: list[int]) -> list[int]:
    """The token ids the model reads before a row's first supervised token, without the chat template's
    ``head`` (when the row starts with it) and from the first ``tail`` on (the end of the user turn); the caller
    keeps the last :data:`DOC_TOKENS` of them."""
    first = mask.index(1) if 1 in mask else len(ids)
    prompt = list(ids[:first])
    if head and prompt[: len(head)] == head:
        prompt = prompt[len(head) :]
    if tail:
        for i in range(len(prompt) - len(tail) + 1):
            if prompt[i : i + len(tail)] == tail:
                return prompt[:i]
    return prompt


def document_rng(model: str, i: int) -> random.Random:
    """The generator of document ``i`` of ``model``'s corpus (a namespace of its own: never a training row's)."""
    return random.Random(f"kvbench-calibration-corpus:{model}:{i}")


def training_documents(model: str, tokenizer, n_docs: int = N_DOCS, length: int = ROW_LENGTH):
    """``[(family, doc_id, text, task, stage, n_tokens)]``: ``n_docs`` documents of ``model``'s final-stage
    mixes (stages in turn), each the last :data:`DOC_TOKENS` tokens of one training row's text before its first
    answer (:func:`document_ids`)."""
    from kvbench.prompt import encode, template_parts

    head_text, tail_text = template_parts(tokenizer)
    head, tail = encode(tokenizer, head_text), encode(tokenizer, tail_text)
    stages = list(final_mixes(model).items())
    docs = []
    for i in range(n_docs):
        stage, mix = stages[i % len(stages)]
        rng = document_rng(model, i)
        ex = training_example(rng, length, tokenizer, mix)
        ids = ex.input_ids.tolist()
        mask = ex.loss_mask.tolist()
        doc = document_ids(ids, mask, head, tail)[-DOC_TOKENS:]
        text = tokenizer.decode(doc)
        docs.append((family(ex.task), f"{i:03d}-{ex.task}", text, ex.task, stage, len(doc)))
    return docs


def write_training_corpus(
    out_dir: str | Path, model: str, tokenizer, n_docs: int = N_DOCS, length: int = ROW_LENGTH
) -> dict:
    """Write :func:`training_documents` as ``out_dir/<family>/<i>-<task>.txt`` and a manifest (:data:`MANIFEST`: one
    entry per document: family, task, stage, tokens; and the totals; a dotfile, so no corpus reader takes it for a
    document). Deterministic. Returns the manifest."""
    from kvbench.atomic import write_dir

    docs = list(training_documents(model, tokenizer, n_docs, length))
    entries = [{"family": fam, "doc": doc_id, "task": task, "stage": stage, "tokens": n}
               for fam, doc_id, _text, task, stage, n in docs]  # fmt: skip
    manifest = {
        "model": model,
        "row_length": length,
        "documents": len(entries),
        "tokens": sum(e["tokens"] for e in entries),
        "per_family": {f: sum(e["family"] == f for e in entries) for f in FAMILIES},
        "entries": entries,
    }

    def write(tmp: Path) -> None:
        for fam, doc_id, text, *_ in docs:
            (tmp / fam).mkdir(parents=True, exist_ok=True)
            (tmp / fam / f"{doc_id}.txt").write_text(text)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")

    write_dir(Path(out_dir), write)  # the whole corpus appears at once, replacing an earlier one
    return manifest


def main(argv: list[str] | None = None) -> None:
    """``python -m kvbench_training.calibration MODEL_DIR MODEL_NAME OUT [N_DOCS|labels]``: write the corpus of
    ``N_DOCS`` documents (default :data:`N_DOCS`; ``labels``: the first :data:`N_LABEL_DOCS`, GateSight's)."""
    import sys

    from transformers import AutoTokenizer

    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 4):
        raise SystemExit("usage: python -m kvbench_training.calibration MODEL_DIR MODEL_NAME OUT [N_DOCS|labels]")
    n = N_DOCS if len(args) == 3 else N_LABEL_DOCS if args[3] == "labels" else int(args[3])
    m = write_training_corpus(args[2], args[1], AutoTokenizer.from_pretrained(args[0]), n)
    print(f"{m['documents']} documents, {m['tokens']} tokens ({m['per_family']}) -> {args[2]}")


if __name__ == "__main__":
    main()
