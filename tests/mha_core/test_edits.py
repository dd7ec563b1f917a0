"""One way to edit a head (mha_core/edits.py): each constructor against a computation written here, both engines
giving the same edited output, and hooks that never outlive their ``with`` block."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.edits import apply_to_concat, chain, forward_hooks, forward_pre_hooks, replace_positions
from mha_core.models.forward import ForwardPass
from tests.conftest import ATTENTION_ATOL, ENGINE_ATOL, ROOT
from tests.model_fixtures import build_tiny_bert, build_tiny_gpt2, build_tiny_llama

BATCH, N, HEADS, D_HEAD = 2, 5, 4, 3


@pytest.fixture
def z() -> torch.Tensor:
    return torch.randn(BATCH, N, HEADS, D_HEAD, generator=torch.Generator().manual_seed(0))


def test_the_public_api_exports_the_edits():
    assert mc.zero_heads is mc.edits.zero_heads
    assert mc.replace_heads is mc.edits.replace_heads
    assert mc.scale_heads is mc.edits.scale_heads
    assert {"edits", "zero_heads", "replace_heads", "scale_heads"} <= set(mc.__all__)


def test_zero_heads_against_a_loop(z):
    edited = mc.zero_heads([2, 0, 2])(z)
    expected = z.clone()
    for head in (0, 2):
        for b in range(BATCH):
            for i in range(N):
                expected[b, i, head] = 0.0
    assert torch.equal(edited, expected)
    assert torch.equal(z[:, :, 1], edited[:, :, 1])  # the others untouched
    with pytest.raises(ValueError, match="out of range"):
        mc.zero_heads([HEADS])(z)
    with pytest.raises(ValueError, match=">= 0"):
        mc.zero_heads([-1])


def test_replace_heads_with_means_and_with_another_run(z):
    means = torch.arange(HEADS * D_HEAD, dtype=torch.float32).reshape(HEADS, D_HEAD)
    edited = mc.replace_heads([1, 3], means)(z)
    expected = z.clone()
    for head in (1, 3):
        expected[:, :, head, :] = means[head]
    assert torch.equal(edited, expected)
    other = z.flip(0) + 10.0  # another run's z: activation patching
    patched = mc.replace_heads([0], other)(z)
    assert torch.equal(patched[:, :, 0], other[:, :, 0])
    assert torch.equal(patched[:, :, 1:], z[:, :, 1:])


def test_scale_heads_values_and_gradient(z):
    factors = torch.tensor([0.0, 1.0, 2.0, -0.5])
    edited = mc.scale_heads(factors)(z)
    for head in range(HEADS):
        assert torch.equal(edited[:, :, head], z[:, :, head] * factors[head])
    per_row = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 3.0]])
    edited = mc.scale_heads(per_row)(z)
    for b in range(BATCH):
        for head in range(HEADS):
            assert torch.equal(edited[b, :, head], z[b, :, head] * per_row[b, head])
    # The gradient at 1 of sum(w * edited) with respect to a gate is sum over that head's entries of w * z.
    weights = torch.randn(z.shape, generator=torch.Generator().manual_seed(1))
    gates = torch.ones(BATCH, HEADS, requires_grad=True)
    (gradient,) = torch.autograd.grad((mc.scale_heads(gates)(z) * weights).sum(), gates)
    expected = (weights * z).sum(dim=(1, 3))
    np.testing.assert_allclose(gradient.numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="do not fit"):
        mc.scale_heads(torch.ones(HEADS + 1))(z)
    with pytest.raises(ValueError, match="factors must be"):
        mc.scale_heads(torch.ones(1, 1, HEADS))


def test_chain_and_concat_view(z):
    store: list = []
    both = chain(lambda z: store.append(z.clone()), None, mc.zero_heads([1]))  # a function returning None keeps z
    edited = both(z)
    assert len(store) == 1 and torch.equal(store[0], z)  # seen before the zeroing
    assert torch.equal(edited[:, :, 1], torch.zeros(BATCH, N, D_HEAD))
    assert chain(None, None) is None
    concat = z.reshape(BATCH, N, HEADS * D_HEAD)
    through = apply_to_concat(mc.zero_heads([1]), concat, HEADS)
    expected = concat.clone()
    expected[..., D_HEAD : 2 * D_HEAD] = 0.0  # head 1's slice of Concat(heads)
    assert torch.equal(through, expected)
    assert torch.equal(apply_to_concat(mc.zero_heads([1]), concat[0], HEADS), expected[0])  # unbatched
    with pytest.raises(ValueError, match="multiple"):
        apply_to_concat(mc.zero_heads([0]), concat[..., :-1], HEADS)
    with pytest.raises(ValueError, match="keep z's shape"):
        apply_to_concat(lambda z: z[:, :1], concat, HEADS)


def test_replace_positions_against_a_loop():
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(1))
    values = torch.randn(4, 5, generator=torch.Generator().manual_seed(2))
    rows = torch.tensor([True, False, True])
    positions = torch.zeros(3, 4, dtype=torch.bool)
    positions[0, 1] = positions[1, 3] = positions[2, 0] = True
    expected = x.clone()
    for b in range(3):
        for i in range(4):
            if rows[b] and positions[b, i]:
                expected[b, i] = values[i]
    assert torch.equal(replace_positions(values, rows=rows, positions=positions)(x), expected)
    assert torch.equal(replace_positions(values)(x), values.expand_as(x))
    z = torch.randn(2, 4, 3, 2)  # a point with more axes: replaced whole at each chosen position
    where = torch.tensor([[True, False, False, True], [False, False, False, False]])
    edited = replace_positions(torch.zeros(4, 3, 2), positions=where)(z)
    assert torch.equal(edited[0, 0], torch.zeros(3, 2)) and torch.equal(edited[0, 1], z[0, 1])
    assert torch.equal(edited[1], z[1])


def test_hooks_are_removed_when_the_block_raises():
    layer = torch.nn.Linear(3, 3)
    x = torch.ones(1, 3)
    before = layer(x).detach()
    with (
        pytest.raises(RuntimeError, match="inside"),
        forward_pre_hooks([(layer, lambda module, args: (args[0] * 0,))]),
    ):
        assert torch.equal(layer(x), layer.bias.detach().expand(1, 3))
        raise RuntimeError("inside")
    with pytest.raises(RuntimeError, match="inside"), forward_hooks([(layer, lambda module, args, output: output * 0)]):
        assert torch.equal(layer(x), torch.zeros(1, 3))
        raise RuntimeError("inside")
    assert not layer._forward_pre_hooks and not layer._forward_hooks
    assert torch.equal(layer(x), before)


# ---- in a model: both engines, the same edit ------------------------------------------------------------
@pytest.fixture(scope="module", params=["bert", "gpt2", "llama"])
def model(request, tmp_path_factory):
    builders = {"bert": build_tiny_bert, "gpt2": build_tiny_gpt2, "llama": build_tiny_llama}
    return mc.load_model(str(builders[request.param](tmp_path_factory.mktemp(request.param), randomised=True)))


def edits_of(kind: str, model) -> dict:
    d_head = model.hf_model.config.hidden_size // model.num_heads
    values = torch.linspace(-1.0, 1.0, model.num_heads * d_head).reshape(model.num_heads, d_head)
    factors = torch.linspace(0.0, 2.0, model.num_heads)
    last = model.num_layers - 1
    return {
        "zero": {"blocks.0.attn.hook_z": mc.zero_heads([1]), f"blocks.{last}.attn.hook_z": mc.zero_heads([0, 2])},
        "replace": {"blocks.0.attn.hook_z": mc.replace_heads([0, 3], values)},
        "scale": {"blocks.1.attn.hook_z": mc.scale_heads(factors)},
    }[kind]


def own_pre_hook(kind: str, model, layer: int):
    """The edit of ``edits_of(kind)`` at ``layer``, written here on the slices of Concat(heads)."""
    d = model.hf_model.config.hidden_size // model.num_heads

    def hook(module, args):
        x = args[0].clone()
        if kind == "zero":
            for head in [1] if layer == 0 else [0, 2]:
                x[..., head * d : (head + 1) * d] = 0.0
        elif kind == "replace":
            values = torch.linspace(-1.0, 1.0, model.num_heads * d)
            for head in (0, 3):
                x[..., head * d : (head + 1) * d] = values[head * d : (head + 1) * d]
        else:
            factors = torch.linspace(0.0, 2.0, model.num_heads)
            for head in range(model.num_heads):
                x[..., head * d : (head + 1) * d] *= factors[head]
        return (x, *args[1:])

    return hook


@pytest.mark.parametrize("kind", ["zero", "replace", "scale"])
def test_both_engines_give_the_same_edited_output(model, kind):
    ids = torch.tensor([model.encode("The cat sat on the mat because it was warm.").input_ids])
    edits = edits_of(kind, model)
    forward = ForwardPass(ids, hooks=edits, keep_hidden=True)
    transformers = model.run_pass(forward, "transformers")
    core = model.run_pass(forward, "core")
    np.testing.assert_allclose(core.hidden.numpy(), transformers.hidden.numpy(), rtol=0, atol=ENGINE_ATOL)
    np.testing.assert_allclose(core.attentions.numpy(), transformers.attentions.numpy(), rtol=0, atol=ENGINE_ATOL)
    np.testing.assert_allclose(core.reference.numpy(), transformers.attentions.numpy(), rtol=0, atol=ATTENTION_ATOL)
    # The transformers engine's edit against the test's own hooks on the output projections.
    projections = model.output_projections()
    layers = [int(name.split(".")[1]) for name in edits]
    handles = [projections[layer].register_forward_pre_hook(own_pre_hook(kind, model, layer)) for layer in layers]
    try:
        with torch.inference_mode():
            own = model.hf_model(input_ids=ids).last_hidden_state
    finally:
        for handle in handles:
            handle.remove()
    np.testing.assert_allclose(transformers.hidden.numpy(), own.numpy(), rtol=0, atol=ENGINE_ATOL)
    plain = model.run_pass(ForwardPass(ids, keep_hidden=True), "transformers")
    assert np.abs(plain.hidden.numpy() - transformers.hidden.numpy()).max() > 1e-3  # the edit did something


def test_an_edit_that_raises_leaves_no_hook_behind(model):
    ids = torch.tensor([model.encode("A dog ran.").input_ids])

    def hooks_on_the_model():  # transformers keeps hooks of its own: the count must not change
        return [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.hf_model.modules()]

    hooks = hooks_on_the_model()
    before = model.run_pass(ForwardPass(ids, keep_hidden=True))

    def broken(z):
        raise RuntimeError("a broken edit")

    for engine in ("transformers", "core"):
        with pytest.raises(RuntimeError, match="a broken edit"):
            model.run_pass(ForwardPass(ids, hooks={"blocks.0.attn.hook_z": broken}), engine)
    assert hooks_on_the_model() == hooks
    after = model.run_pass(ForwardPass(ids, keep_hidden=True))
    assert torch.equal(after.hidden, before.hidden) and torch.equal(after.attentions, before.attentions)


def test_hooks_are_registered_only_in_edits():
    """``register_forward_pre_hook`` / ``register_forward_hook`` appear in the library only in edits.py (and no
    torch function mode is entered anywhere else)."""
    calls = []
    for path in sorted((ROOT / "mha_core").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("register_forward"):
                calls.append(Path(path).relative_to(ROOT).as_posix())
            if isinstance(node, ast.Name) and node.id == "TorchFunctionMode":
                calls.append(Path(path).relative_to(ROOT).as_posix())
    assert calls and set(calls) == {"mha_core/edits.py"}
