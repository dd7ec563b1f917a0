"""Encoder-decoder models (T5, BART, Marian) on tiny random checkpoints saved here: loading, the three attentions
against transformers, the from-scratch engine at 1e-4, greedy writing against generate(), word level, save/load,
and the cross-attention measures against computations written in this file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_fixtures import SEQ2SEQ_BUILDERS, build_tiny_t5

import mha_core as mc
from mha_core.analysis import cross as cross_metrics
from mha_core.engine.encoder_decoder import core_seq2seq_attentions
from mha_core.errors import EngineNotSupported, HeadscopeError
from mha_core.models.seq2seq import words_from_pieces
from mha_core.models.tokens import TokenDisplay
from mha_core.operations import Seq2SeqAttention
from mha_core.operations.base import RUN_PEAK_FACTOR
from tests.conftest import ATTENTION_ATOL, ENGINE_ATOL, METRIC_TOL

SOURCE = "The cat sat on the mat."
TARGET = "A dog chased the cat across the garden."


@pytest.fixture(scope="module", params=sorted(SEQ2SEQ_BUILDERS))
def seq2seq(request, tmp_path_factory):
    path = SEQ2SEQ_BUILDERS[request.param](tmp_path_factory.mktemp(request.param))
    return request.param, path, mc.load_model(str(path))


def reference(path, source_ids, decoder_ids, mask=None):
    """transformers' own attentions, from a model loaded here without Headscope."""
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(
            input_ids=torch.as_tensor(source_ids),
            attention_mask=None if mask is None else torch.as_tensor(mask),
            decoder_input_ids=torch.as_tensor(decoder_ids),
            output_attentions=True,
            use_cache=False,
        )
    return model, {
        "encoder": torch.stack(out.encoder_attentions, 1).numpy(),
        "decoder": torch.stack(out.decoder_attentions, 1).numpy(),
        "cross": torch.stack(out.cross_attentions, 1).numpy(),
    }


def test_loads_as_seq2seq_model(seq2seq):
    name, _, model = seq2seq
    assert isinstance(model, mc.Seq2SeqModel)
    assert model.family == {"t5": "t5", "bart": "bart", "marian": "bart"}[name]
    assert (model.encoder_layers, model.num_heads, model.decoder_layers, model.decoder_heads) == (2, 4, 2, 4)
    assert model.can_write


def test_three_attentions_equal_transformers(seq2seq):
    _, path, model = seq2seq
    run = model.run(SOURCE, TARGET)
    source_ids, target_ids = run.encoder.metadata["token_ids"], run.decoder.metadata["token_ids"]
    assert target_ids[0] == model.decoder_start_id
    assert run.cross.metadata["token_ids"] == target_ids and run.cross.metadata["source_token_ids"] == source_ids
    n_src, n_tgt = len(source_ids), len(target_ids)
    assert run.encoder.attentions.shape == (2, 4, n_src, n_src)
    assert run.decoder.attentions.shape == (2, 4, n_tgt, n_tgt)
    assert run.cross.attentions.shape == (2, 4, n_tgt, n_src)
    assert run.cross.key_tokens == run.encoder.tokens and run.cross.tokens == run.decoder.tokens
    assert run.decoder.is_causal and not run.encoder.is_causal
    assert np.all(np.triu(run.decoder.attentions, 1) == 0)
    _, ref = reference(path, [source_ids], [target_ids])
    for kind in ("encoder", "decoder", "cross"):
        np.testing.assert_allclose(run.kind(kind).attentions, ref[kind][0], atol=ATTENTION_ATOL)
        np.testing.assert_allclose(run.kind(kind).attentions.sum(-1), 1.0, atol=1e-5)


def test_core_engine_matches_transformers(seq2seq):
    _, path, model = seq2seq
    run = model.run(SOURCE, TARGET, engine="core")
    _, ref = reference(path, [run.encoder.metadata["token_ids"]], [run.decoder.metadata["token_ids"]])
    for kind in ("encoder", "decoder", "cross"):
        assert run.kind(kind).engine == "core"
        np.testing.assert_allclose(run.kind(kind).attentions, ref[kind][0], atol=ENGINE_ATOL)
        assert run.kind(kind).max_abs_diff < ENGINE_ATOL


def test_core_engine_with_padded_batch(seq2seq):
    """Two sources of different lengths in one batch: the padding keys get no weight, as in transformers."""
    _, path, model = seq2seq
    pad = model.tokenizer.pad_token_id
    source = [[0, 10, 20, 30, 40, 2], [0, 11, 21, 2, pad, pad]]
    mask = [[1] * 6, [1, 1, 1, 1, 0, 0]]
    decoder = [[model.decoder_start_id, 12, 22, 32], [model.decoder_start_id, 13, 23, 33]]
    hf_model, ref = reference(path, source, decoder, mask)
    core = core_seq2seq_attentions(hf_model, source, decoder, attention_mask=mask)
    for kind in ("encoder", "cross"):
        np.testing.assert_allclose(getattr(core, kind).numpy(), ref[kind], atol=ENGINE_ATOL)
        assert np.all(getattr(core, kind).numpy()[1, ..., 4:] == 0)
    np.testing.assert_allclose(core.decoder.numpy(), ref["decoder"], atol=ENGINE_ATOL)


def test_gated_t5_and_unequal_stacks(tmp_path):
    """T5 v1.1's gated feed-forward, and a decoder deeper than the encoder: the engine still matches."""
    path = build_tiny_t5(tmp_path, gated=True, num_decoder_layers=3)
    model = mc.load_model(str(path))
    assert (model.encoder_layers, model.decoder_layers) == (2, 3)
    run = model.run(SOURCE, TARGET, engine="core")
    assert run.cross.attentions.shape[0] == 3
    assert max(run.kind(kind).max_abs_diff for kind in ("encoder", "decoder", "cross")) < ENGINE_ATOL


def greedy_by_hand(hf_model, source_ids, start, eos, limit):
    """Greedy decoding written out: the argmax of the next-token logits, one token at a time."""
    ids = [start]
    with torch.no_grad():
        for _ in range(limit):
            logits = hf_model(input_ids=torch.tensor([source_ids]), decoder_input_ids=torch.tensor([ids])).logits
            ids.append(int(logits[0, -1].argmax()))
            if ids[-1] == eos:
                break
    return ids


def test_model_writes_the_target_greedily(seq2seq):
    _, path, model = seq2seq
    run = model.run(SOURCE, max_new_tokens=7)
    assert run.generated
    source_ids, written = run.encoder.metadata["token_ids"], run.decoder.metadata["token_ids"]
    hf_model, _ = reference(path, [source_ids], [[model.decoder_start_id]])
    generated = hf_model.generate(input_ids=torch.tensor([source_ids]), do_sample=False, num_beams=1, max_new_tokens=7)[
        0
    ].tolist()
    assert written == generated
    assert written == greedy_by_hand(hf_model, source_ids, model.decoder_start_id, hf_model.config.eos_token_id, 7)
    assert run.cross.attentions.shape == (2, 4, len(written), len(source_ids))
    # The written target's attentions are those of a run given the same ids.
    again = model.run_ids(source_ids, written)
    np.testing.assert_allclose(again.cross.attentions, run.cross.attentions, atol=ATTENTION_ATOL)


def test_word_level_on_both_sides(seq2seq):
    _, _, model = seq2seq
    run = model.run(SOURCE, TARGET)
    words = run.to_words()
    cross = run.cross
    tgt_units, tgt_texts, _, _ = cross.word_groups()
    src_units, src_texts, _ = cross.key_word_groups()
    expected = np.zeros((cross.num_layers, cross.num_heads, len(tgt_texts), len(src_texts)))
    for u in range(len(tgt_texts)):  # rows averaged over a target word's pieces, columns summed over a source word's
        rows = cross.attentions[:, :, tgt_units == u]
        for v in range(len(src_texts)):
            expected[:, :, u, v] = rows[..., src_units == v].sum(-1).mean(-1)
    np.testing.assert_allclose(words.cross.attentions, expected, atol=ATTENTION_ATOL)
    assert words.cross.tokens == words.decoder.tokens and words.cross.key_tokens == words.encoder.tokens
    assert "cat" in words.encoder.tokens and "chased" in words.decoder.tokens
    np.testing.assert_allclose(words.cross.attentions.sum(-1), 1.0, atol=1e-5)
    plain = run.without_special().cross
    assert plain.attentions.shape[-1] == int((~cross.key_special_mask).sum())
    np.testing.assert_allclose(plain.attentions.sum(-1), 1.0, atol=1e-5)


def test_save_and_load(seq2seq, tmp_path):
    _, _, model = seq2seq
    run = model.run(SOURCE, TARGET)
    back = mc.Seq2SeqRun.load(run.save(tmp_path / "run.npz"))
    for kind in ("encoder", "decoder", "cross"):
        assert np.array_equal(back.kind(kind).attentions, run.kind(kind).attentions)
        assert back.kind(kind).tokens == run.kind(kind).tokens
        assert back.kind(kind).metadata["token_ids"] == run.kind(kind).metadata["token_ids"]
    assert isinstance(back.cross, mc.CrossAttentionRun) and back.cross.key_tokens == run.cross.key_tokens
    assert np.array_equal(back.cross.key_word_ids, run.cross.key_word_ids)
    assert back.generated is False
    with pytest.raises(ValueError, match="not a Headscope encoder-decoder run"):
        mc.Seq2SeqRun.load(run.encoder.save(tmp_path / "encoder.npz"))


def test_bad_input_is_refused(seq2seq):
    _, _, model = seq2seq
    with pytest.raises(HeadscopeError):
        model.run("   ", TARGET)
    with pytest.raises(EngineNotSupported, match="Unknown engine"):
        model.run(SOURCE, TARGET, engine="nope")


def test_long_inputs_are_cut_to_the_positions(seq2seq):
    _, _, model = seq2seq
    long_text = " ".join(["cat"] * 200)
    run = model.run(long_text, long_text)
    assert run.encoder.num_tokens == model.max_tokens and run.encoder.truncated
    assert run.decoder.num_tokens == model.max_tokens and run.decoder.truncated


def test_words_from_pieces():
    """Word starts from the pieces' marks: SentencePiece's, byte-level BPE's, and after a special token."""

    class Plain:
        backend_tokenizer = None
        all_special_tokens = ("</s>",)

    display = TokenDisplay(Plain())
    pieces = ["▁The", "▁c", "at", "▁sat", ".", "</s>"]
    word_ids, words = words_from_pieces(pieces, np.array([0, 0, 0, 0, 0, 1], dtype=bool), display)
    assert word_ids.tolist() == [0, 1, 1, 2, 2, -1] and words == ["The", "cat", "sat."]
    word_ids, words = words_from_pieces(["<s>", "A", "Ġdog"], np.array([1, 0, 0], dtype=bool), display)
    assert word_ids.tolist() == [-1, 0, 1]


# ---- cross-attention measures, against computations written here ----
def _random_cross(seed=0, shape=(2, 3, 5, 6)):
    weights = np.random.default_rng(seed).random(shape).astype(np.float32) ** 4
    return weights / weights.sum(-1, keepdims=True)


def test_alignment_scores_count_argmax_hits():
    weights = _random_cross()
    alignment = [(0, 0), (1, 2), (1, 3), (3, 5), (4, 4)]
    scores = cross_metrics.alignment_scores(weights, alignment)
    expected = np.zeros(weights.shape[:2])
    for layer in range(weights.shape[0]):
        for head in range(weights.shape[1]):
            hits = []
            for target in (0, 1, 3, 4):
                allowed = {s for t, s in alignment if t == target}
                hits.append(int(np.argmax(weights[layer, head, target])) in allowed)
            expected[layer, head] = np.mean(hits)
    np.testing.assert_allclose(scores, expected, **METRIC_TOL)
    # A head that is the alignment itself scores 1.
    perfect = np.zeros((1, 1, 5, 6), dtype=np.float32)
    for target, source in [(0, 0), (1, 2), (3, 5), (4, 4), (2, 1)]:
        perfect[0, 0, target, source] = 1.0
    assert cross_metrics.alignment_scores(perfect, alignment)[0, 0] == 1.0
    with pytest.raises(ValueError, match="outside"):
        cross_metrics.alignment_scores(weights, [(9, 0)])


def test_diagonal_baseline():
    # 5 target x 9 source positions: the diagonal puts target i beside source 2i.
    assert cross_metrics.diagonal_source(5, 9).tolist() == [0, 2, 4, 6, 8]
    assert cross_metrics.diagonal_baseline([(0, 0), (1, 2), (2, 5), (3, 6)], 5, 9) == 0.75
    # A diagonal head scores exactly the baseline.
    diagonal = np.zeros((1, 1, 5, 9), dtype=np.float32)
    diagonal[0, 0, np.arange(5), cross_metrics.diagonal_source(5, 9)] = 1.0
    alignment = [(0, 0), (1, 2), (2, 5), (3, 6)]
    assert cross_metrics.alignment_scores(diagonal, alignment)[0, 0] == cross_metrics.diagonal_baseline(alignment, 5, 9)


def test_entropy_and_coverage():
    weights = _random_cross(1)
    expected_entropy = np.array(
        [[np.mean([-sum(p * np.log2(p) for p in row if p > 0) for row in head]) for head in layer] for layer in weights]
    )
    np.testing.assert_allclose(cross_metrics.entropy(weights), expected_entropy, **METRIC_TOL)
    expected_coverage = np.array(
        [
            [
                np.mean([max(head[i, j] for i in range(head.shape[0])) >= 0.2 for j in range(head.shape[1])])
                for head in layer
            ]
            for layer in weights
        ]
    )
    np.testing.assert_allclose(cross_metrics.coverage(weights, threshold=0.2), expected_coverage, **METRIC_TOL)
    uniform = np.full((1, 1, 4, 8), 1 / 8, dtype=np.float32)
    np.testing.assert_allclose(cross_metrics.entropy(uniform), 3.0, **METRIC_TOL)
    assert cross_metrics.coverage(uniform, threshold=0.1)[0, 0] == 1.0


def test_cross_head_table_on_a_run(seq2seq):
    _, _, model = seq2seq
    run = model.run(SOURCE, TARGET).to_words()
    n_tgt, n_src = run.cross.num_tokens, run.cross.num_keys
    alignment = [(i, min(i, n_src - 1)) for i in range(n_tgt)]
    table = cross_metrics.cross_head_table(run.cross, alignment)
    assert len(table) == run.cross.num_layers * run.cross.num_heads
    row = table.iloc[5]
    head = run.cross.attentions[int(row["layer"]), int(row["head"])]
    hits = [int(np.argmax(head[i])) == min(i, n_src - 1) for i in range(n_tgt)]
    assert row["alignment_score"] == pytest.approx(np.mean(hits))
    assert set(table.columns) >= {"entropy", "coverage", "alignment_score", "diagonal_baseline"}


def test_attention_bytes_are_the_three_arrays(seq2seq):
    """What the app reserves before a pass (``Seq2SeqAttention.peak_bytes``): ``RUN_PEAK_FACTOR`` x the bytes of the
    run's three attention arrays."""
    _, _, model = seq2seq
    run = model.run(SOURCE, TARGET)
    operation = Seq2SeqAttention.of(model, SOURCE, TARGET)
    arrays = sum(run.kind(k).attentions.nbytes for k in mc.seq2seq_run.KINDS)
    assert operation.attention_bytes(model) == arrays
    assert operation.peak_bytes(model) == int(RUN_PEAK_FACTOR * arrays)
    written = model.run(SOURCE)  # the model writes at most DEFAULT_MAX_NEW_TOKENS tokens
    writing = Seq2SeqAttention.of(model, SOURCE)
    assert writing.attention_bytes(model) >= sum(written.kind(k).attentions.nbytes for k in mc.seq2seq_run.KINDS)


def test_missing_weights_are_refused(tmp_path):
    """A checkpoint whose weights leave a layer to random initialisation is refused, as for other families."""
    from model_fixtures import build_tiny_bart
    from safetensors.torch import load_file, save_file

    path = build_tiny_bart(tmp_path / "bart")
    weights = load_file(path / "model.safetensors")
    missing = next(name for name in weights if name.endswith("encoder.layers.0.fc1.weight"))
    del weights[missing]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(mc.errors.ModelLoadError, match="missing 1 of the weights"):
        mc.load_model(str(path))
