"""Label directories: labelling a corpus (``kvbench gatesight label``) and reading the result back.

Layout of a label directory::

    labels.json                       manifest: format, model name/source/fingerprint, model shape
                                      (attn_layer_ids, gdn_layer_ids, n_heads, n_kv_heads, head_dim,
                                      n_value_heads), the label recipe, the corpus path, versions
    <corpus>/<doc key>.safetensors    one per document: utility [L_attn, H_kv, n] (raw Δr max, not normalised),
                                      beta / g / vnorm [L_gdn, n, Hv], gate_head_mean [L_attn, H];
                                      metadata "kvbench": corpus, doc_id, n, prot, n_doc_tokens,
                                      continuation_lengths, checks, seed

Each document's context is the chat prefix (template head, protected: ``prot`` tokens) + the document (cut to
``max_doc_tokens``) + the assistant-turn suffix (template tail). Labelling is resumable: documents whose file
exists are skipped; a directory labelled for another model or recipe is refused.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvbench.atomic import write_atomic, write_with
from kvbench.corpus import Document, read_corpus
from kvbench.errors import KvbenchError

from .utility import DocumentLabel, LabelConfig, doc_seed, label_document

LABEL_FORMAT = "kvbench-gatesight-labels-v1"
MANIFEST = "labels.json"
# recipe fields that must agree when resuming into an existing directory
_RECIPE_KEYS = ("m", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "max_doc_tokens")

__all__ = ["LABEL_FORMAT", "LabelSet", "LabelledDoc", "label_corpus", "load_labels", "model_shape"]


def model_shape(engine) -> dict:
    """The model facts a label directory and an artifact record (checked against each other and the parent)."""
    model = engine.model
    tc = model.config.get_text_config()
    return {
        "model_type": str(getattr(model.config, "model_type", "")),
        "attn_layer_ids": list(engine.adapter.attn_layer_ids),
        "gdn_layer_ids": list(engine.adapter.gdn_layer_ids),
        "n_heads": int(engine.n_heads),
        "n_kv_heads": int(engine.n_kv_heads),
        "head_dim": int(engine.head_dim),
        "n_value_heads": int(tc.linear_num_value_heads),
        "hidden_size": int(tc.hidden_size),
    }


def _write_doc(path: Path, doc: Document, label: DocumentLabel, n_doc_tokens: int, seed: int) -> None:
    from safetensors.torch import save_file

    tensors = {
        "utility": label.utility.float().contiguous(),
        "beta": torch.stack(label.beta).float().contiguous(),
        "g": torch.stack(label.g).float().contiguous(),
        "vnorm": torch.stack(label.vnorm).float().contiguous(),
        "gate_head_mean": label.gate_head_mean.float().contiguous(),
    }
    meta = {
        "corpus": doc.corpus,
        "doc_id": doc.doc_id,
        "key": doc.key,
        "n": label.n,
        "prot": label.prot,
        "n_doc_tokens": n_doc_tokens,
        "continuation_lengths": label.continuation_lengths,
        "checks": label.checks,
        "seed": seed,
    }
    write_with(path, lambda tmp: save_file(tensors, str(tmp), metadata={"kvbench": json.dumps(meta, sort_keys=True)}))


def _check_manifest(root: Path, manifest: dict) -> None:
    path = root / MANIFEST
    if not path.exists():
        return
    old = json.loads(path.read_text())
    if old.get("fingerprint") != manifest["fingerprint"]:
        raise KvbenchError(
            f"{root} holds labels of model fingerprint {str(old.get('fingerprint'))[:16]}…, not of this model "
            f"({manifest['fingerprint'][:16]}…); label into a new --out directory"
        )
    diff = [k for k in _RECIPE_KEYS if old.get("recipe", {}).get(k) != manifest["recipe"].get(k)]
    if diff:
        raise KvbenchError(
            f"{root} was labelled with a different recipe ({', '.join(diff)} differ); label into a new --out "
            "directory or repeat the original options"
        )


def label_corpus(
    model,
    tokenizer,
    corpus: str | Path | Iterable[Document],
    out: str | Path,
    config: LabelConfig | None = None,
    *,
    fingerprint: str | None = None,
    model_name: str = "",
    model_source: str = "",
    limit: int | None = None,
    progress: bool = True,
    console=None,
) -> dict:
    """Label every document of ``corpus`` (a path for :func:`~.utility.read_corpus`, or documents) into ``out``.

    Returns a summary ``{"labelled", "skipped_existing", "skipped_short", "failed", "dir"}``. Check failures
    (:class:`~.utility.LabelCheckError`) propagate: a label that fails Appendix B's checks is never written.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kvbench.engines.torch_engine import TorchEngine
    from kvbench.prompt import encode, template_parts

    config = config or LabelConfig()
    out = Path(out)
    docs = read_corpus(corpus) if isinstance(corpus, (str, Path)) else list(corpus)
    if limit is not None:
        docs = docs[:limit]
    engine = TorchEngine(model, tokenizer)
    if fingerprint is None:
        from kvbench.models import fingerprint as model_fingerprint

        fingerprint = model_fingerprint(model, tokenizer)
    import transformers

    import kvbench

    manifest = {
        "format": LABEL_FORMAT,
        "fingerprint": fingerprint,
        "model": model_name,
        "model_source": str(model_source),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        **model_shape(engine),
        "recipe": config.to_json(),
        "corpus": str(corpus) if isinstance(corpus, (str, Path)) else "(documents)",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": {
            "kvbench": kvbench.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
    }
    _check_manifest(out, manifest)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MANIFEST).exists():
        write_atomic(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    head, tail = template_parts(tokenizer) if tokenizer is not None else ("", "")

    prefix, suffix = encode(tokenizer, head), encode(tokenizer, tail)
    from kvbench.budgets import protected_length

    summary = {"labelled": 0, "skipped_existing": 0, "skipped_short": 0, "dir": str(out)}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task("labelling", total=len(docs))
        for doc in docs:
            path = out / doc.corpus / f"{doc.key}.safetensors"
            bar.update(task, description=f"{doc.corpus}/{doc.doc_id}"[:60])
            if path.exists():
                summary["skipped_existing"] += 1
                bar.advance(task)
                continue
            body = encode(tokenizer, doc.text)[: config.max_doc_tokens]
            if len(body) < config.min_doc_tokens:
                summary["skipped_short"] += 1
                bar.advance(task)
                continue
            ids = prefix + body + suffix
            seed = doc_seed(config.seed, doc.corpus, doc.doc_id)
            label = label_document(engine, ids, protected_length(len(prefix), len(ids)), config, seed=seed)
            _write_doc(path, doc, label, len(body), seed)
            summary["labelled"] += 1
            bar.advance(task)
    return summary


# ----------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------


@dataclass
class LabelledDoc:
    """One labelled document on disk (tensors loaded on demand with :meth:`load`)."""

    corpus: str
    doc_id: str
    path: Path
    n: int
    prot: int
    meta: dict = field(default_factory=dict)

    def load(self, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """``utility`` [L, H_kv, n], ``beta``/``g``/``vnorm`` [L_gdn, n, Hv], ``gate_head_mean`` [L, H]."""
        from safetensors.torch import load_file

        return load_file(str(self.path), device=str(device))


@dataclass
class LabelSet:
    """A label directory: its manifest and documents (sorted by corpus, then document id)."""

    root: Path
    manifest: dict
    docs: list[LabelledDoc]

    @property
    def corpora(self) -> list[str]:
        return sorted({d.corpus for d in self.docs})

    @property
    def fingerprint(self) -> str:
        return str(self.manifest["fingerprint"])

    def __getitem__(self, key: str):
        return self.manifest[key]


def load_labels(root: str | Path) -> LabelSet:
    """Read a label directory written by :func:`label_corpus`."""
    from safetensors import safe_open

    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise KvbenchError(
            f"{root} is not a GateSight label directory (no {MANIFEST}); create one with "
            "`kvbench gatesight label --model M --corpus PATH --out DIR`"
        )
    manifest = json.loads(path.read_text())
    if manifest.get("format") != LABEL_FORMAT:
        raise KvbenchError(f"{path} has format {manifest.get('format')!r}, expected {LABEL_FORMAT!r}")
    docs = []
    for f in sorted(root.glob("*/*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            meta = json.loads((fh.metadata() or {})["kvbench"])
        docs.append(LabelledDoc(meta["corpus"], meta["doc_id"], f, int(meta["n"]), int(meta["prot"]), meta))
    docs.sort(key=lambda d: (d.corpus, d.doc_id))
    if not docs:
        raise KvbenchError(f"{root} has no labelled documents yet; run `kvbench gatesight label` into it")
    return LabelSet(root, manifest, docs)
