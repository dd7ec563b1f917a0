"""Long runs (mha_core.models.long): exact blocks, pooled overviews, streamed metrics, long-context roles, memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core import native
from mha_core.analysis.long_roles import LOCAL_MAX_WINDOW, generated_copies, needle_copies, retrieval_scores
from mha_core.engine.blockwise import distinct_key_heads
from mha_core.errors import InputTextError
from mha_core.models import long as long_module
from mha_core.models.long import greedy_answer, needle_prompt, needle_question, run_long, run_needle
from mha_core.operations.long import long_run_bytes
from tests.conftest import ATTENTION_ATOL, ENGINE_ATOL, METRIC_TOL, require
from tests.model_fixtures import (
    CORPUS,
    build_tiny_bert,
    build_tiny_gpt2,
    build_tiny_llama,
    build_tiny_mpnet,
    save_gpt2_tokenizer,
)

BUILDERS = {
    "bert": lambda path: build_tiny_bert(path, randomised=True),
    "mpnet": build_tiny_mpnet,
    "gpt2": lambda path: build_tiny_gpt2(path, randomised=True),
    "llama": lambda path: build_tiny_llama(path, max_positions=256, randomised=True),
}
TEXT = " ".join(CORPUS)


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def family_model(request, tmp_path_factory):
    return mc.load_model(str(BUILDERS[request.param](tmp_path_factory.mktemp(request.param))))


@pytest.fixture(scope="module")
def family_runs(family_model):
    """(model, dense core run, transformers run, long run) of one text at the model's full length."""
    model = family_model
    ids = model.encode_long(TEXT).input_ids[: model.context_length]
    dense = model.run_ids(ids, engine="core")
    eager = model.run_ids(ids, engine="transformers")
    return model, dense, eager, run_long(model, token_ids=ids, keep_hidden=True)


def test_blocks_equal_the_dense_weights_and_transformers_eager(family_runs):
    _, dense, eager, long = family_runs
    n = long.num_tokens
    assert n == dense.num_tokens and n >= 60
    for layer in range(long.num_layers):
        for head in range(long.num_heads):
            block = long.attention_block(layer, head, (0, n), (0, n))
            assert block.dtype == np.float32
            np.testing.assert_allclose(block, dense.attentions[layer, head], atol=ATTENTION_ATOL, rtol=0)
            np.testing.assert_allclose(block, eager.attentions[layer, head], atol=ENGINE_ATOL, rtol=0)
    # A block anywhere, by range or by a list of positions, is that part of the matrix.
    rows, cols = [n - 1, 3, 17], [0, 5, n - 2]
    np.testing.assert_allclose(
        long.attention_block(1, 2, rows, cols), dense.attentions[1, 2][np.ix_(rows, cols)], atol=ATTENTION_ATOL
    )
    np.testing.assert_allclose(
        long.attention_block(0, 1, slice(10, 30), range(5, 25)),
        dense.attentions[0, 1, 10:30, 5:25],
        atol=ATTENTION_ATOL,
    )


def test_hidden_states_equal_the_dense_path(family_runs):
    model, _, _, long = family_runs
    outputs: dict = {}
    mc.core_attentions(model.hf_model, torch.tensor([long.token_ids]), outputs=outputs)
    np.testing.assert_allclose(long.hidden.numpy(), outputs["hidden"][0].numpy(), atol=1e-5, rtol=1e-5)


def test_streamed_metrics_equal_the_dense_metrics(family_runs):
    _, dense, _, long = family_runs
    expected, streamed = mc.head_metrics(dense), long.head_metrics()
    assert list(streamed.columns) == list(expected.columns)
    for column in expected.columns:
        if expected[column].dtype.kind in "fi":
            np.testing.assert_allclose(
                streamed[column].to_numpy(float), expected[column].to_numpy(float), **METRIC_TOL, err_msg=column
            )
        else:
            assert streamed[column].tolist() == expected[column].tolist(), column


def test_the_c_row_pass_and_torchs_path_give_the_same_run(family_runs, monkeypatch):
    """The pass above ran each block's softmax and row reductions in C (mha_core.native); torch's operations give
    the same overviews, log-sum-exps, row statistics and metrics table, within float32's rounding."""
    require(native.available(), f"the native row pass ({native.why_not()})")
    model, _, _, in_c = family_runs
    monkeypatch.setattr(native, "USE_NATIVE", False)
    by_torch = run_long(model, token_ids=in_c.token_ids)
    np.testing.assert_allclose(in_c.overview_mean, by_torch.overview_mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(in_c.overview_max, by_torch.overview_max, rtol=1e-5, atol=1e-7)
    for a, b in zip(in_c.layers, by_torch.layers, strict=True):
        torch.testing.assert_close(a.log_sum_exp, b.log_sum_exp, rtol=1e-5, atol=1e-5)
    rows_c, rows_torch = in_c.statistics.rows, by_torch.statistics.rows
    for name, values in rows_c.items():
        if name == "window":  # a row whose mass sits at the share within float32's rounding may move by one key
            assert np.abs(values - rows_torch[name]).max() <= 1 and (values != rows_torch[name]).mean() < 0.01
        elif name == "argmax":
            assert (values != rows_torch[name]).mean() < 0.01  # ties within rounding only
        else:
            np.testing.assert_allclose(values, rows_torch[name], rtol=1e-4, atol=1e-4 * (1 + np.abs(values).max()))
    np.testing.assert_allclose(in_c.statistics.column_mass, by_torch.statistics.column_mass, rtol=1e-5, atol=1e-4)
    expected, got = by_torch.head_metrics(), in_c.head_metrics()
    for column in expected.columns:
        if expected[column].dtype.kind in "fi":
            np.testing.assert_allclose(
                got[column].to_numpy(float), expected[column].to_numpy(float), **METRIC_TOL, err_msg=column
            )


def _pooled_by_hand(matrix: np.ndarray, rows, cols, size: int, reduce: str) -> np.ndarray:
    """An independent pooling: each cell's entries gathered by the cell's own token range."""

    def edges(start, stop):
        count = min(size, stop - start)
        return [start + (k * (stop - start)) // count for k in range(count + 1)]

    row_edges, col_edges = edges(*rows), edges(*cols)
    out = np.zeros((len(row_edges) - 1, len(col_edges) - 1))
    for a in range(len(row_edges) - 1):
        for b in range(len(col_edges) - 1):
            cell = matrix[row_edges[a] : row_edges[a + 1], col_edges[b] : col_edges[b + 1]]
            out[a, b] = cell.mean() if reduce == "mean" else cell.max()
    return out


@pytest.mark.parametrize("reduce", ["mean", "max"])
def test_overviews_pool_the_exact_weights(family_runs, reduce):
    _, dense, _, long = family_runs
    n = long.num_tokens
    stored = long.overview_mean if reduce == "mean" else long.overview_max
    cells = min(n, 128)  # the default size: one cell a token below 128 tokens
    assert stored.shape == (long.num_layers, long.num_heads, cells, cells)
    for layer, head, size, rows, cols in (
        (1, 1, 7, None, None),
        (0, 3, 5, (3, 40), (11, 29)),
        (1, 0, 64, (20, 21), None),
    ):
        matrix = dense.attentions[layer, head]
        expected = _pooled_by_hand(matrix, rows or (0, n), cols or (0, n), size, reduce)
        got = long.attention_overview(layer, head, size, reduce, rows=rows, cols=cols)
        np.testing.assert_allclose(got, expected, atol=ATTENTION_ATOL, rtol=0)
        np.testing.assert_allclose(
            dense.attention_overview(layer, head, size, reduce, rows=rows, cols=cols), expected, atol=1e-6, rtol=0
        )
    expected = _pooled_by_hand(dense.attentions[1, 2], (0, n), (0, n), 128, reduce)
    np.testing.assert_allclose(stored[1, 2], expected, atol=ATTENTION_ATOL, rtol=0)
    np.testing.assert_array_equal(long.attention_overview(1, 2, reduce=reduce), stored[1, 2])


def test_overview_pooled_during_the_pass_at_a_smaller_size(family_model):
    ids = family_model.encode_long(TEXT).input_ids[: family_model.context_length]
    long = run_long(family_model, token_ids=ids, overview_size=9)
    dense = family_model.run_ids(ids, engine="core")
    n = long.num_tokens
    for reduce, stored in (("mean", long.overview_mean), ("max", long.overview_max)):
        for layer in range(long.num_layers):
            for head in range(long.num_heads):
                expected = _pooled_by_hand(dense.attentions[layer, head], (0, n), (0, n), 9, reduce)
                np.testing.assert_allclose(stored[layer, head], expected, atol=ATTENTION_ATOL, rtol=0)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return mc.load_model(str(build_tiny_llama(tmp_path_factory.mktemp("llama256"), max_positions=256, randomised=True)))


def test_grouped_key_heads_are_stored_once(tiny_llama):
    long = run_long(tiny_llama, token_ids=list(range(5, 45)))
    config = tiny_llama.hf_model.config
    for layer in long.layers:
        assert layer.key.shape[0] == config.num_key_value_heads == 2
        assert layer.key_of_head.tolist() == [0, 0, 1, 1]
    stored, key_of_head = distinct_key_heads(torch.stack([torch.ones(3, 2), torch.zeros(3, 2), torch.zeros(3, 2)]))
    assert stored.shape[0] == 2 and key_of_head.tolist() == [0, 1, 1]


def test_a_decoders_prefix_does_not_depend_on_what_follows(tiny_llama):
    ids = [int(i) for i in np.random.default_rng(0).integers(5, 300, size=240)]
    long, short = run_long(tiny_llama, token_ids=ids), run_long(tiny_llama, token_ids=ids[:60])
    for layer in range(long.num_layers):
        for head in range(long.num_heads):
            np.testing.assert_allclose(
                long.attention_block(layer, head, (0, 60), (0, 60)),
                short.attention_block(layer, head, (0, 60), (0, 60)),
                atol=ATTENTION_ATOL,
                rtol=0,
            )


def test_stored_memory_grows_linearly_with_length(tiny_llama):
    rng = np.random.default_rng(1)
    sizes = {}
    for n in (120, 240):
        long = run_long(tiny_llama, token_ids=[int(i) for i in rng.integers(5, 300, size=n)], overview_size=16)
        counted = sum(
            t.numel() * t.element_size()
            for layer in long.layers
            for t in (layer.query, layer.key, layer.key_of_head, layer.log_sum_exp)
        )
        counted += long.overview_mean.nbytes + long.overview_max.nbytes
        counted += long.statistics.values.nbytes + long.statistics.column_mass.nbytes
        counted += long.statistics.key_features.numel() * 4
        assert long.stored_bytes == counted
        assert long_run_bytes(tiny_llama, n, overview_size=16) > counted  # the reservation covers what is kept
        sizes[n] = counted - (long.overview_mean.nbytes + long.overview_max.nbytes)  # overviews: a fixed size
    # Twice the tokens, twice the bytes beyond the fixed-size overviews (n x n would be four times).
    assert 1.95 < sizes[240] / sizes[120] < 2.05


def test_a_document_runs_dense_up_to_the_cap_and_long_above(tiny_llama, tmp_path):
    assert tiny_llama.max_tokens == tiny_llama.context_length == 256  # this model's own limit binds
    assert isinstance(mc.run_document(tiny_llama, TEXT * 3), mc.AttentionRun)  # cut at 256: the dense path
    model = mc.load_model(str(build_tiny_llama(tmp_path / "llama1024", max_positions=1024, randomised=True)))
    assert model.max_tokens == 512 and model.context_length == 1024  # the dense cap binds, then the model's
    short, long = mc.run_document(model, CORPUS[0]), mc.run_document(model, TEXT * 8)
    assert isinstance(short, mc.AttentionRun) and isinstance(long, mc.LongRun)
    assert 512 < long.num_tokens <= 1024
    np.testing.assert_allclose(
        short.attention_block(1, 1, slice(0, 5), [0, 2, 4]),
        long.attention_block(1, 1, (0, 5), [0, 2, 4]),
        atol=ATTENTION_ATOL,
    )


def test_progress_reports_every_block_and_can_stop_the_pass(tiny_llama):
    reports = []
    run_long(tiny_llama, token_ids=list(range(5, 205)), progress=lambda done, total, message="": reports.append(done))
    assert reports == sorted(reports) and reports[-1] == tiny_llama.num_layers

    class Stopped(Exception):
        pass

    def stop_in_the_second_layer(done, total, message=""):
        if done > 1:
            raise Stopped

    with pytest.raises(Stopped):
        run_long(tiny_llama, token_ids=list(range(5, 205)), progress=stop_in_the_second_layer)


def test_bad_requests_raise_clear_errors(tiny_llama):
    long = run_long(tiny_llama, token_ids=list(range(5, 45)))
    with pytest.raises(ValueError, match="no head"):
        long.attention_block(9, 0, (0, 4), (0, 4))
    with pytest.raises(ValueError, match="rows must lie"):
        long.attention_block(0, 0, (30, 50), (0, 4))
    with pytest.raises(ValueError, match="reduce"):
        long.attention_overview(0, 0, 8, "median")
    with pytest.raises(mc.errors.HeadscopeError):
        run_long(tiny_llama)


# ---- long-context roles on a model built so that the answer is known ----------------------------------
POSITIONS = 128  # one-hot position vectors in the first 128 dimensions; token vectors in the rest
D_HEAD = 128


def build_role_model(path) -> str:
    """A one-layer GPT-2 whose head 0 copies (a query attends to the position ``COPY_SHIFT - 1`` back), head 1
    is a sink (every query on position 0) and head 2 is local (every query on itself)."""
    from transformers import GPT2Config, GPT2Model

    tokenizer = save_gpt2_tokenizer(path, model_max_length=POSITIONS)
    d = 3 * D_HEAD
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=d, n_layer=1, n_head=3, n_positions=POSITIONS)
    model = GPT2Model(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.wpe.weight.zero_()
        model.wpe.weight[:, :POSITIONS] = torch.eye(POSITIONS)
        model.wte.weight.zero_()
        model.wte.weight[:, POSITIONS:] = 0.05 * torch.randn(
            model.wte.weight.shape[0], d - POSITIONS, generator=generator
        )
        attention = model.h[0].attn.c_attn  # Conv1D: weight [in, out], out = q | k | v, head h = columns h*128..
        attention.weight.zero_()
        attention.bias.zero_()
        q, k = slice(0, d), slice(d, 2 * d)
        eye = torch.eye(D_HEAD)
        # Head 0: q_i picks position i + 1 - COPY_SHIFT, k_j is position j.
        attention.weight[COPY_SHIFT - 1 : POSITIONS, q][:, 0:D_HEAD] = eye[: POSITIONS - COPY_SHIFT + 1]
        attention.weight[:POSITIONS, k][:, 0:D_HEAD] = eye
        # Head 1: a constant query along dimension 0, the key of position 0 along it.
        attention.bias[q][D_HEAD] = 40.0
        attention.weight[0, k][D_HEAD] = 1.0
        # Head 2: q_i and k_j are both position vectors: largest when j = i.
        attention.weight[:POSITIONS, q][:, 2 * D_HEAD : 3 * D_HEAD] = eye
        attention.weight[:POSITIONS, k][:, 2 * D_HEAD : 3 * D_HEAD] = eye
    model.save_pretrained(path)
    return str(path)


COPY_SHIFT = 100  # the answer repeats the needle 100 tokens after it


def test_retrieval_sink_and_local_roles_on_a_built_model(tmp_path):
    model = mc.load_model(build_role_model(tmp_path / "roles"))
    rng = np.random.default_rng(3)
    ids = [int(i) for i in rng.integers(10, 300, size=POSITIONS)]
    needle_start, length = 20, 6
    ids[needle_start + COPY_SHIFT : needle_start + COPY_SHIFT + length] = ids[needle_start : needle_start + length]
    copies = needle_copies(ids, needle_start, needle_start + COPY_SHIFT, length)
    assert copies == [(needle_start + COPY_SHIFT + t - 1, needle_start + t) for t in range(length)]
    long = run_long(model, token_ids=ids)
    roles = long.roles(copies)
    found = {(row.role.split(" (")[0], row.layer, row.head): row for row in roles.itertuples()}
    assert ("retrieval", 0, 0) in found and found["retrieval", 0, 0].score == 1.0
    assert found["retrieval", 0, 0].n == length
    assert not any(role == "retrieval" and head != 0 for role, _, head in found)
    assert ("sink at length", 0, 1) in found and found["sink at length", 0, 1].score > 0.99
    assert not any(role == "sink at length" and head != 1 for role, _, head in found)
    assert ("local", 0, 2) in found and found["local", 0, 2].role == "local (window 0)"
    assert not any(role == "local" and head != 2 for role, _, head in found)
    windows = long.local_windows()
    assert windows.loc[2, "median_window"] == 0 and windows.loc[1, "median_window"] > LOCAL_MAX_WINDOW
    # The scores are the dense argmax's.
    dense = model.run_ids(ids, engine="core")
    scores = retrieval_scores(dense.attentions.argmax(axis=-1), copies)
    assert scores["score"].tolist() == [1.0, 0.0, 0.0]
    by_distance = long.sink_by_distance(band=32)
    assert (by_distance.query("head == 1")["mass"] > 0.99).all()


def test_needle_prompt_places_the_needle_and_its_copy(tiny_llama):
    ids, copies = needle_prompt(tiny_llama, TEXT * 4, "the cat sat", "where?", depth=0.5, num_tokens=200)
    assert len(ids) <= 200 and copies
    for query, source in copies:
        assert ids[query + 1] == ids[source] and source < query


def test_needle_question_ends_with_the_question_and_leaves_room_for_the_answer(tiny_llama):
    prompt = needle_question(tiny_llama, TEXT * 4, "the cat sat", "where?", depth=0.5, num_tokens=200)
    encode = tiny_llama.tokenizer
    needle = encode(" the cat sat", add_special_tokens=False)["input_ids"]
    question = encode(" where?", add_special_tokens=False)["input_ids"]
    ids = list(prompt.token_ids)
    assert ids[prompt.needle_start : prompt.needle_start + prompt.needle_length] == needle
    assert ids[-len(question) :] == question and prompt.answer_tokens == len(needle) + 4
    assert len(ids) + prompt.answer_tokens <= 200
    # The teacher-forced input (the benchmark's) is the same prompt with the needle repeated after it.
    forced, copies = prompt.teacher_forced()
    assert forced == [*ids, *needle] and copies == needle_copies(forced, prompt.needle_start, len(ids), len(needle))


def test_generated_copies_and_retrieval_scores_with_a_token_twice_in_the_needle():
    # Needle at 1..3 holds tokens 2, 3, 2; the answer (from 6) writes 2 then 3 then 9 (not in the needle).
    ids = [1, 2, 3, 2, 9, 9, 2, 3, 9]
    copies = generated_copies(ids, 1, 3, 6)
    assert copies == [(5, 1), (5, 3), (6, 2)]  # token 2 may be copied from either place; 9 is no copy
    argmax = np.zeros((1, 3, len(ids)), dtype=np.int64)
    argmax[0, 0, 5], argmax[0, 0, 6] = 3, 2  # head 0: the second 2, then the 3: both copies
    argmax[0, 1, 5], argmax[0, 1, 6] = 1, 7  # head 1: the first 2, then not the needle
    argmax[0, 2, 5], argmax[0, 2, 6] = 4, 4  # head 2: neither
    scores = retrieval_scores(argmax, copies)
    assert scores["score"].tolist() == [1.0, 0.5, 0.0] and (scores["n"] == 2).all()
    # Chance: a random visible key lands on one of 2 needle places from query 5 (6 keys), on 1 from query 6.
    assert scores["chance"].iloc[0] == pytest.approx((2 / 6 + 1 / 7) / 2)
    with pytest.raises(ValueError, match="before the answer"):
        generated_copies(ids, 4, 3, 6)


def reference_greedy(model, ids: list[int], steps: int) -> list[int]:
    """Greedy decoding the plain way: the whole sequence through the checkpoint, no cache, every step."""
    out = list(ids)
    with torch.inference_mode():
        for _ in range(steps):
            hidden = model.hf_model(input_ids=torch.tensor([out])).last_hidden_state
            out.append(int(model.logits(hidden[0, -1]).argmax()))
    return out[len(ids) :]


def test_greedy_answer_is_the_checkpoints_own_greedy_continuation(tmp_path, monkeypatch):
    model = mc.load_model(str(build_tiny_llama(tmp_path / "lm", max_positions=256, head=True, randomised=True)))
    monkeypatch.setattr(long_module, "ANSWER_PREFILL_ROWS", 16)  # the prompt read in 7 blocks of the cache
    monkeypatch.setattr(long_module, "_ends_answer", lambda text: False)  # a random model never ends a sentence
    prompt = [int(i) for i in np.random.default_rng(0).integers(5, 200, size=100)]
    seen = []
    answer = greedy_answer(model, prompt, 6, progress=lambda done, total, message="": seen.append((done, total)))
    assert answer == reference_greedy(model, prompt, len(answer)) and len(answer) == 6
    assert seen[-1] == (7 + 6, 7 + 6)
    # The needle test: the answer appended, the long path's rows of it scored, the copies those of the answer.
    needle = needle_question(model, TEXT * 4, "the cat sat", "where?", depth=0.3, num_tokens=200)
    run = run_needle(model, needle)
    answered = run.metadata["needle"]
    expected = greedy_answer(model, needle.token_ids, needle.answer_tokens)
    assert list(answered.answer_ids) == expected and run.token_ids == [*needle.token_ids, *expected]
    assert answered.answer_start == len(needle.token_ids) and run.hidden is None
    assert list(answered.copies) == generated_copies(
        run.token_ids, needle.needle_start, needle.needle_length, len(needle.token_ids)
    )
    with pytest.raises(InputTextError, match="does not write text"):
        greedy_answer(mc.load_model(str(build_tiny_llama(tmp_path / "base", max_positions=64))), prompt[:10], 2)


@pytest.mark.slow
def test_smollm2_long_run_matches_transformers_eager(smollm2):
    assert smollm2.context_length == 8192 and smollm2.max_tokens == 512  # the long path lifts the dense cap
    text = " ".join(CORPUS * 5)
    long = run_long(smollm2, text)
    eager = smollm2.run_ids(long.token_ids, engine="transformers")
    n = long.num_tokens
    assert 300 < n <= 512
    for layer in (0, 14, 29):
        for head in range(smollm2.num_heads):
            np.testing.assert_allclose(
                long.attention_block(layer, head, (0, n), (0, n)),
                eager.attentions[layer, head],
                atol=ENGINE_ATOL,
                rtol=0,
            )
    assert long.layers[0].key.shape[0] == smollm2.hf_model.config.num_key_value_heads == 3
