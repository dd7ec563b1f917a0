"""Where weights come from, and what is refused: code in checkpoints, incomplete weights, probing
the file system through messages; folders built once, atomically, verified, one builder at a time."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import time
from pathlib import Path

import pytest

import mha_core as mc
from mha_core.errors import InputTextError, ModelLoadError, quoted, redact_paths
from mha_core.models import sources
from tests.conftest import WAIT_S, until
from tests.model_fixtures import build_tiny_bert

# ---- code never runs from a checkpoint -------------------------------------------------------------


class _WritesMarker:
    """Unpickling this calls ``open(marker, "w")``: what a malicious pytorch_model.bin would do."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickled_weights_that_would_run_code_are_refused(tmp_path):
    folder = build_tiny_bert(tmp_path / "evil-pickle")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "pickle-ran"
    with open(folder / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"embeddings.word_embeddings.weight": _WritesMarker(str(marker))}, handle)
    with pytest.raises(ModelLoadError, match=r"could run code when loaded.*safetensors") as caught:
        mc.load_model(str(folder))
    assert not marker.exists()
    assert str(tmp_path) not in str(caught.value).replace(str(folder), "")  # no other server path shown


def test_config_asking_for_custom_code_never_runs_it(tmp_path):
    marker = tmp_path / "custom-code-ran"
    code = f"open({str(marker)!r}, 'w').close()\nfrom transformers import BertModel as CustomModel\n"
    # A known architecture with auto_map: loaded with transformers' own class, with a warning.
    known = build_tiny_bert(tmp_path / "known")
    (known / "custom_model.py").write_text(code)
    config = json.loads((known / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "custom_model.CustomModel", "AutoConfig": "custom_model.CustomConfig"}
    (known / "config.json").write_text(json.dumps(config))
    model = mc.load_model(str(known))
    assert any("auto_map" in warning and "never runs" in warning for warning in model.warnings)
    assert model.run("the cat sat").attentions.shape[:2] == (2, 4)
    # An architecture transformers does not know: refused with a clear reason.
    unknown = build_tiny_bert(tmp_path / "unknown")
    (unknown / "custom_model.py").write_text(code)
    config["model_type"] = "headscope-custom"
    (unknown / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"needs code of its own.*never runs code"):
        mc.load_model(str(unknown))
    assert not marker.exists()


# ---- incomplete checkpoints ---------------------------------------------------------------------------
def test_weights_that_do_not_cover_the_config_are_refused(tmp_path):
    folder = build_tiny_bert(tmp_path / "short")
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 24  # the weights hold 2 layers
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"missing \d+ of the weights .*random numbers"):
        mc.load_model(str(folder))


def test_missing_pooler_is_a_warning_not_a_refusal(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = build_tiny_bert(tmp_path / "no-pooler")
    weights = load_file(folder / "model.safetensors")
    save_file(
        {k: v for k, v in weights.items() if not k.startswith("pooler.")},
        folder / "model.safetensors",
        metadata={"format": "pt"},
    )
    model = mc.load_model(str(folder))
    assert len(model.warnings) == 1 and "pooler" in model.warnings[0]


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda data: b"", "header too small"),
        (lambda data: os.urandom(len(data)), "header too large"),
        (lambda data: data[: len(data) // 2], "not fully covered"),
        (lambda data: data[: len(data) - 1], "not fully covered"),
    ],
    ids=["empty", "random-bytes", "half", "one-byte-short"],
)
def test_a_damaged_weights_file_is_an_incomplete_checkpoint(tmp_path, damage, reason):
    folder = build_tiny_bert(tmp_path / "damaged")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(damage(data))
    with pytest.raises(ModelLoadError, match=r"incomplete checkpoint: its weights file model\.safetensors is damaged"):
        mc.load_model(str(folder))
    with pytest.raises(ModelLoadError, match=reason) as caught:
        mc.load_model(str(folder))
    # The folder the user named is quoted; no other path of this machine is.
    assert str(tmp_path) not in str(caught.value).replace(str(folder), "")
    weights.write_bytes(data)  # repaired: it loads
    assert mc.load_model(str(folder)).run("the cat sat").attentions.shape[:2] == (2, 4)


# ---- names, allow-lists and messages ------------------------------------------------------------------
def test_allowlist_matches_spellings_without_touching_the_file_system(tmp_path):
    assert sources.parse_allowlist(None) is None and sources.parse_allowlist(" * ") is None
    allowed = sources.parse_allowlist("minilm, smollm2, /srv/models/tiny/, org/model")
    assert allowed == ("minilm", "smollm2", "/srv/models/tiny/", "org/model")
    for name in ("MiniLM", "smollm2 ", "/srv/models/./tiny", "/srv/models/tiny", "org/model"):
        assert sources.model_allowed(name, allowed), name
    for name in ("bert-base-uncased", "/srv/models", "/etc/passwd", "../tiny", "org/model2", "x" * 100_000):
        assert not sources.model_allowed(name, allowed), name[:40]
    assert sources.model_allowed("anything/at-all", None)


def test_messages_quote_input_short_and_hide_paths():
    assert quoted("x" * 100_000).endswith("…'") and len(quoted("x" * 100_000)) < 210
    text = "Error no file named model.safetensors in directory /root/.cache/hub/x and C:\\Users\\me\\m"
    assert redact_paths(text) == "Error no file named model.safetensors in directory <path> and <path>"
    assert redact_paths("loading /home/me/model failed", keep=("/home/me/model",)) == "loading /home/me/model failed"
    assert redact_paths("hub id org/model, ratio 1/2") == "hub id org/model, ratio 1/2"


def test_downloads_turned_off_answer_without_asking_the_hub(monkeypatch):
    def no_probe(timeout=0):
        raise AssertionError("the hub must not be contacted when downloads are off")

    monkeypatch.setattr(sources, "hub_reachable", no_probe)
    with pytest.raises(ModelLoadError, match="downloads are turned off"):
        mc.load_model("headscope-tests/never-cached-model", download=False)


def test_invisible_text_counts_as_empty(tmp_path):
    model = mc.load_model(str(build_tiny_bert(tmp_path / "bert")))
    for text in ("", "   ", "\u200b\u200c\u200d\ufeff", "\u2060 \u200e\u200f"):
        with pytest.raises(InputTextError, match="empty"):
            model.run(text)
    assert model.run("\u200bthe cat").num_tokens >= 3


# Accents or marks alone, control characters (C0, DEL, C1), zero-width characters: nothing a reader or a
# BERT tokenizer keeps (BERT's normaliser drops marks and control characters).
CONTENT_FREE_TEXTS = ("\u0301\u0301", "\u0300\u0327 \u0308", "\x01\x02\x7f", "\x1b\x85\x9f", "\u200b\u200d\u2060")


def test_text_the_tokenizer_drops_whole_is_empty_text(tmp_path):
    from mha_core.errors import EmptyTextError
    from tests.model_fixtures import build_tiny_llama

    encoder = mc.load_model(str(build_tiny_bert(tmp_path / "bert")))
    for text in CONTENT_FREE_TEXTS:
        with pytest.raises(EmptyTextError, match="empty") as caught:
            encoder.run(text)
        assert caught.value.what == "text" and isinstance(caught.value, InputTextError)
        with pytest.raises(EmptyTextError, match="pair text") as caught:
            encoder.run("the cat", text_pair=text)
        assert caught.value.what == "pair text"
        with pytest.raises(EmptyTextError):
            encoder.encode([text])  # pre-split words too
    # One readable character is enough: the mark then belongs to it.
    assert encoder.run("a\u0301").tokens == ["[CLS]", "a", "[SEP]"]
    # A byte-level decoder reads every byte: marks and control characters are tokens after its BOS.
    decoder = mc.load_model(str(build_tiny_llama(tmp_path / "llama")))
    assert decoder.default_bos
    for text, expected_bytes in (("\u0301\u0301", 4), ("\x01\x02\x7f", 3)):
        run = decoder.run(text)
        assert run.special_mask.tolist() == [True] + [False] * expected_bytes and run.metadata["bos"]
        assert run.attentions.shape[-1] == 1 + expected_bytes
    with pytest.raises(EmptyTextError):
        decoder.run("\u200b\u200d\u2060")
    # Text that is not valid Unicode (a lone surrogate, as a command line's undecodable bytes become).
    with pytest.raises(InputTextError, match="not valid Unicode"):
        encoder.run("the \udcff cat")


# ---- folders built once -----------------------------------------------------------------------------------
def _slow_build(staging: Path, progress) -> None:
    """A build that takes a while and counts itself in a shared file."""
    counter = Path(os.environ["HEADSCOPE_TEST_COUNTER"])
    with open(counter, "a") as handle:
        handle.write("built\n")
    for index in range(3):
        (staging / f"part{index}.bin").write_bytes(os.urandom(1 << 16))
        time.sleep(0.3)


def _build_in_child(target: str) -> str:
    return str(sources.build_once(Path(target), _slow_build, "test folder"))


def test_two_processes_build_once_and_both_get_a_verified_folder(tmp_path, monkeypatch):
    counter = tmp_path / "builds.txt"
    monkeypatch.setenv("HEADSCOPE_TEST_COUNTER", str(counter))
    target = tmp_path / "cache" / "folder"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(_build_in_child, [str(target)] * 2)
    assert results == [str(target)] * 2
    assert counter.read_text().count("built") == 1
    assert sources.verify_folder(target) is None
    assert sorted(p.name for p in target.parent.iterdir() if not p.name.endswith(".lock")) == ["folder"]


def test_truncated_or_damaged_folders_are_rebuilt_with_a_message(tmp_path, monkeypatch):
    counter = tmp_path / "builds.txt"
    monkeypatch.setenv("HEADSCOPE_TEST_COUNTER", str(counter))
    target = tmp_path / "folder"
    sources.build_once(target, _slow_build, "test folder")
    part = target / "part1.bin"
    for damage, expected in (
        (lambda: part.write_bytes(part.read_bytes()[:100]), "truncated"),
        (lambda: part.write_bytes(bytes(len(part.read_bytes()))), "checksum"),
    ):
        damage()
        assert expected in sources.verify_folder(target)
        messages: list[str] = []
        sources.build_once(target, _slow_build, "test folder", progress=lambda d, t, m, seen=messages: seen.append(m))
        assert sources.verify_folder(target) is None
        assert any("building it again" in m and expected in m for m in messages)
    assert counter.read_text().count("built") == 3


def test_a_build_that_fails_halfway_leaves_nothing_that_looks_done(tmp_path):
    def failing(staging: Path, progress) -> None:
        (staging / "half.bin").write_bytes(b"x" * 10)
        raise KeyboardInterrupt  # a user's Ctrl-C, or a kill, in the middle of a conversion

    target = tmp_path / "folder"
    with pytest.raises(KeyboardInterrupt):
        sources.build_once(target, failing, "test folder")
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def _build_waiting_for_release(staging: Path, progress) -> None:
    """A build that writes a part, then waits (bounded) until the test lets it finish."""
    counter = Path(os.environ["HEADSCOPE_TEST_COUNTER"])
    with open(counter, "a") as handle:
        handle.write("built\n")
    (staging / "part.bin").write_bytes(os.urandom(1 << 12))
    release = counter.with_name("release")
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if release.exists():
            return
        time.sleep(0.05)
    raise TimeoutError("the test never released the build")


def _build_in_child_waiting(target: str) -> str:
    return str(sources.build_once(Path(target), _build_waiting_for_release, "test folder"))


def test_the_next_build_removes_what_killed_builds_left(tmp_path, monkeypatch):
    counter = tmp_path / "builds.txt"
    monkeypatch.setenv("HEADSCOPE_TEST_COUNTER", str(counter))
    cache = tmp_path / "cache"
    target = cache / "model-123"
    # What a build killed mid-way leaves: its staging folder, and a broken copy it was removing.
    stale = [cache / ".model-123-building-k1l2m3", cache / ".model-123.broken-4242"]
    for folder in stale:
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "model.safetensors").write_bytes(b"x" * 1000)
    # Another model's folders and staging (its own lock) are not this build's to remove.
    others = [cache / ".model-1234-building-abc", cache / "model-12", cache / ".model-12-building-xyz"]
    for folder in others:
        folder.mkdir()
    sources.build_once(target, _slow_build, "test folder")
    assert sources.verify_folder(target) is None
    assert not any(folder.exists() for folder in stale)
    assert all(folder.exists() for folder in others)
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == sorted(
        ["model-123", *(folder.name for folder in others)]
    )


def test_a_build_in_progress_in_another_process_keeps_its_staging_folder(tmp_path, monkeypatch):
    import threading

    counter = tmp_path / "builds.txt"
    monkeypatch.setenv("HEADSCOPE_TEST_COUNTER", str(counter))
    target = tmp_path / "cache" / "model-7"
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        child = pool.apply_async(_build_in_child_waiting, (str(target),))
        # The child (a new Python importing torch: seconds, or a minute on a busy machine) holds the lock once its
        # staging folder exists.
        until(lambda: list(target.parent.glob(".model-7-building-*")))
        staging = list(target.parent.glob(".model-7-building-*"))
        assert len(staging) == 1
        # This process's build waits for the lock while the child's build is in progress...
        results = []
        waiting = threading.Thread(target=lambda: results.append(sources.build_once(target, _slow_build, "test")))
        waiting.start()
        waiting.join(1.0)
        assert waiting.is_alive() and staging[0].is_dir()  # ...and has removed nothing of it
        (tmp_path / "release").write_text("go")
        assert child.get(timeout=120) == str(target)
        waiting.join(120)
    assert results == [target] and sources.verify_folder(target) is None
    assert counter.read_text().count("built") == 1  # the waiting build used the child's folder
