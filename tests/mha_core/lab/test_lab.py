"""The lab: tasks, scorers from roles.py, a seeded training run that grows an induction circuit, checkpoints."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from mha_core.analysis.roles import detection_score, prefix_matching_score, previous_token_pattern
from mha_core.errors import HeadscopeError
from mha_core.lab import Lab, LabConfig, LabModel, history_frame, phase_change_step, role_appearance
from mha_core.lab.model import masked_loss, training_loss
from mha_core.lab.tasks import IGNORE, induction_batch, largest_batch, positional_batch, role_scores
from mha_core.lab.training import HISTORY_COLUMNS


@pytest.fixture(scope="module")
def grown():
    """The default induction lab after 400 seeded steps (10 to 20 s on one core, depending on load)."""
    torch.set_num_threads(1)
    lab = Lab(LabConfig(seed=0))
    lab.train(400, score_every=50)
    return lab


def test_induction_batch_repeats_one_segment_at_a_random_offset():
    batch = induction_batch(np.random.default_rng(0), 200, 24, 32)
    offsets = set()
    for ids, targets, focus in zip(batch.inputs, batch.targets, batch.focus):
        values, counts = np.unique(ids, return_counts=True)
        repeated = values[counts > 1]
        assert counts.max() == 2 and len(repeated) >= 2  # one copied segment, every other token distinct
        first = [int(np.flatnonzero(ids == v)[0]) for v in repeated]
        second = [int(np.flatnonzero(ids == v)[1]) for v in repeated]
        assert len({b - a for a, b in zip(first, second)}) == 1  # the copy keeps the order: one offset
        offsets.add(second[0] - first[0])
        # The focus queries sit in the copy, and their targets are the next token of the copy.
        where = np.flatnonzero(focus)
        assert set(where) <= set(second) and len(where) == len(repeated) - 1
        np.testing.assert_array_equal(targets[:-1], ids[1:])
        assert targets[-1] == IGNORE
    assert len(offsets) > 5  # the period is not fixed: no positional head can solve it


def test_positional_and_largest_batches():
    batch = positional_batch(np.random.default_rng(1), 4, 10, 16, offset=3)
    np.testing.assert_array_equal(batch.targets[:, 3:], batch.inputs[:, :-3])
    assert (batch.targets[:, :3] == IGNORE).all()
    batch = largest_batch(np.random.default_rng(1), 4, 10, 16)
    np.testing.assert_array_equal(batch.targets, np.maximum.accumulate(batch.inputs, axis=1))


def test_role_scores_are_the_roles_scorers_on_hand_built_heads():
    """A perfect previous-token head and a perfect induction head get the scores of roles.py."""
    config = LabConfig(seq_len=12, vocab_size=16)
    batch = induction_batch(np.random.default_rng(2), 3, 12, 16)
    n = 12
    attentions = np.zeros((3, 2, 1, n, n))
    for index, ids in enumerate(batch.inputs):
        attentions[index, 0, 0] = np.eye(n, k=-1)
        attentions[index, 0, 0, 0, 0] = 1.0
        for i in range(n):
            earlier = [j for j in range(i) if ids[j] == ids[i]]
            attentions[index, 1, 0, i, earlier[0] + 1 if earlier else 0] = 1.0
    scores = role_scores(config, attentions, batch)
    assert scores["previous_token"][0, 0] == pytest.approx((n - 1) / n)
    assert scores["induction"][1, 0] == pytest.approx(1.0)
    expected = np.mean([detection_score(a[1, 0], previous_token_pattern(n)) for a in attentions])
    assert scores["previous_token"][1, 0] == pytest.approx(expected)
    expected = np.mean([prefix_matching_score(a[0, 0], ids) for a, ids in zip(attentions, batch.inputs)])
    assert scores["induction"][0, 0] == pytest.approx(expected)


def test_a_seeded_run_grows_previous_token_then_induction_heads(grown):
    scores = grown.scores().set_index(["layer", "head"])
    start = grown.records[0]
    previous_l0 = scores.loc[0, "previous_token"].max()
    induction_l1 = scores.loc[1, "induction"].max()
    # Chance levels: even attention scores about 0.15 (previous token) and 0.07 (induction) here.
    assert start["scores"]["previous_token"].max() < 0.2 and start["scores"]["induction"].max() < 0.15
    # One seeded run measured 0.83 and 0.96 (the goal: both above 0.8).
    assert previous_l0 > 0.7 and previous_l0 > 2 * scores.loc[1, "previous_token"].max()
    assert induction_l1 > 0.85 and induction_l1 > 3 * scores.loc[0, "induction"].max()
    # The phase change: the loss on the copied positions falls from about log(128) to a tenth of it.
    history = grown.history()
    assert start["repeated_loss"] > 4.0 and grown.records[-1]["repeated_loss"] < 0.15 * start["repeated_loss"]
    step = phase_change_step(history)
    assert step is not None and 0 < step <= 400
    appearance = role_appearance(history).set_index("role")
    assert appearance.loc["induction", "layer"] == 1 and appearance.loc["previous_token", "layer"] == 0
    assert 0 < appearance.loc["induction", "appears_at"] <= 400


def test_ablating_the_grown_induction_head_brings_the_repeated_loss_back(grown):
    scores = grown.scores()
    head = int(scores[scores["layer"] == 1].sort_values("induction").iloc[-1]["head"])
    result = grown.ablation(1, head)
    assert result["ablated_repeated_loss"] > result["repeated_loss"] + 1.0
    # Another layer-1 head matters far less for the copied positions.
    other = (head + 1) % grown.config.num_heads
    assert grown.ablation(1, other)["ablated_repeated_loss"] < result["ablated_repeated_loss"]
    with pytest.raises(HeadscopeError, match="no head"):
        grown.ablation(2, 0)


def test_history_is_long_form_and_round_trips_through_csv(grown, tmp_path):
    history = grown.history()
    assert list(history.columns) == HISTORY_COLUMNS
    steps = sorted(set(history["step"]))
    assert steps == list(range(0, 401, 50))
    config = grown.config
    assert len(history) == len(steps) * config.num_layers * config.num_heads * 2
    assert set(history["role"]) == {"previous_token", "induction"}
    last = history[history["step"] == 400].set_index(["role", "layer", "head"])["score"]
    scores = grown.scores().set_index(["layer", "head"])
    np.testing.assert_allclose(last.loc["induction"].to_numpy(), scores["induction"].to_numpy())
    path = tmp_path / "history.csv"
    history.to_csv(path, index=False)
    pd.testing.assert_frame_equal(pd.read_csv(path), history, check_dtype=False)


def test_checkpoint_round_trip_resumes_the_same_run(tmp_path):
    torch.set_num_threads(1)
    config = LabConfig(seq_len=12, vocab_size=16, batch_size=8, d_model=16, num_heads=2, seed=5)
    straight = Lab(config)
    straight.train(6, score_every=3)
    first = Lab(config)
    first.train(3, score_every=3)
    path = first.save(tmp_path / "lab.pt")
    # weights_only: the file holds tensors and plain values only.
    assert torch.load(path, weights_only=True)["config"]["seed"] == 5
    resumed = Lab.load(path)
    assert resumed.step == 3 and len(resumed.records) == 2
    resumed.train(3, score_every=3)
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)
    np.testing.assert_allclose(resumed.history()["score"], straight.history()["score"], atol=1e-4)


def test_same_seed_same_run_and_settings_are_honoured():
    torch.set_num_threads(1)
    config = LabConfig(seq_len=10, vocab_size=12, batch_size=4, d_model=16, num_heads=2, seed=1, positions="sinusoidal")
    a, b = Lab(config), Lab(config)
    a.train(4, score_every=2)
    b.train(4, score_every=2)
    pd.testing.assert_frame_equal(a.history().drop(columns="seconds"), b.history().drop(columns="seconds"))
    mlp = Lab(config, mlp=True, num_layers=3, positions="none")
    assert len(mlp.model.blocks) == 3 and mlp.model.blocks[0].mlp is not None and mlp.model.position is None
    # Sinusoidal positions are a buffer with position_offsets rows more than seq_len.
    assert a.model.position.shape == (10 + config.position_offsets, 16) and not a.model.position.requires_grad


@pytest.mark.parametrize("task, role, offset", [("positional", "offset_-2", 2), ("largest", "copy_largest", 3)])
def test_other_tasks_grow_their_heads(task, role, offset):
    torch.set_num_threads(1)
    lab = Lab(LabConfig(task=task, offset=offset, seq_len=12, vocab_size=16, batch_size=32, num_layers=1, seed=0))
    lab.train(150, score_every=150)
    start, end = lab.records[0], lab.records[-1]
    assert end["loss"] < 0.5 * start["loss"]
    assert end["scores"][role].max() > start["scores"][role].max() + 0.3


def test_bad_settings_are_clear_errors(tmp_path):
    with pytest.raises(HeadscopeError, match="unknown lab task"):
        LabConfig(task="parity")
    with pytest.raises(HeadscopeError, match="divisible"):
        LabConfig(d_model=30, num_heads=4)
    with pytest.raises(HeadscopeError, match="vocab_size"):
        LabConfig(vocab_size=10, seq_len=24)
    with pytest.raises(HeadscopeError, match="positions"):
        LabConfig(positions="rotary")
    with pytest.raises(HeadscopeError, match="position_offsets"):
        LabConfig(position_offsets=-1)
    with pytest.raises(HeadscopeError, match="other_weight"):
        LabConfig(other_weight=1.5)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(HeadscopeError, match="not a lab checkpoint"):
        Lab.load(bad)


def test_history_frame_of_no_records_and_phase_change_before_it_happens():
    assert list(history_frame([]).columns) == HISTORY_COLUMNS
    flat = history_frame(
        [
            {"step": s, "seconds": 0.0, "loss": 3.0, "repeated_loss": 3.0, "scores": {"induction": np.zeros((1, 1))}}
            for s in (0, 10)
        ]
    )
    assert phase_change_step(flat) is None
    assert np.isnan(role_appearance(flat).loc[0, "appears_at"])


def test_cli_prints_scores_and_writes_the_long_csv_and_a_checkpoint(tmp_path, capsys):
    from mha_core.__main__ import main

    csv, checkpoint = tmp_path / "history.csv", tmp_path / "lab.pt"
    argv = ["lab", "--task", "positional", "--offset", "2", "--steps", "40", "--seed", "3", "--layers", "1"]
    argv += ["--heads", "2", "--d-model", "16", "--score-every", "20", "--threads", "1"]
    assert main([*argv, "--csv", str(csv), "--save", str(checkpoint)]) == 0
    out = capsys.readouterr().out
    history = pd.read_csv(csv)
    assert list(history.columns) == HISTORY_COLUMNS
    assert sorted(set(history["step"])) == [0, 20, 40] and set(history["role"]) == {"offset_-2"}
    assert len(history) == 3 * 2
    # The printed table is the last scored step of the CSV, and the checkpoint reloads to the same scores.
    last = history[history["step"] == 40]
    for row in last.itertuples():
        assert f"{row.layer:5d} {row.head:4d} {row.score:15.3f}" in out
    lab = Lab.load(checkpoint)
    assert lab.step == 40 and lab.config.offset == 2 and lab.config.num_heads == 2
    np.testing.assert_allclose(lab.scores()["offset_-2"], last["score"], atol=1e-6)
    assert main(["lab", "--task", "induction", "--d-model", "30", "--heads", "4", "--steps", "1"]) == 2
    assert "divisible" in capsys.readouterr().err


def test_a_lab_run_is_an_attention_run_the_views_and_metrics_take(grown):
    from mha_core.analysis.metrics import head_metrics

    run = grown.run(0)
    np.testing.assert_allclose(run.attentions, grown.evaluate()["attentions"][0], atol=1e-6)
    assert run.is_causal and run.tokens == [str(int(t)) for t in grown.eval_batch.inputs[0]]
    metrics = head_metrics(run)
    assert len(metrics) == grown.config.num_layers * grown.config.num_heads
    # The layer-0 head with the best previous-token score has its argmax one token back more often than not.
    scores = grown.scores()
    best = scores[scores["layer"] == 0].sort_values("previous_token").iloc[-1]
    row = metrics[(metrics["layer"] == 0) & (metrics["head"] == best["head"])].iloc[0]
    assert row["argmax_offset"] in (-1, 0)


def test_training_loss_weighs_the_focus_positions():
    torch.manual_seed(0)
    logits = torch.randn(3, 6, 9)
    targets = torch.randint(0, 9, (3, 6))
    targets[:, -1] = IGNORE
    focus = torch.rand(3, 6) < 0.4
    focus[0, 0] = True
    per = torch.nn.functional.cross_entropy(logits.reshape(-1, 9), targets.reshape(-1).clamp(min=0), reduction="none")
    valid = (targets != IGNORE).reshape(-1)
    for weight in (0.0, 0.3, 1.0):
        w = torch.where(focus.reshape(-1), 1.0, weight)[valid]
        expected = (per[valid] * w).sum() / w.sum()
        torch.testing.assert_close(training_loss(logits, targets, focus, weight), expected)
    # The two ends are the plain losses: every trained position, and the focus positions only.
    torch.testing.assert_close(training_loss(logits, targets, focus, 1.0), masked_loss(logits, targets))
    torch.testing.assert_close(training_loss(logits, targets, focus, 0.0), masked_loss(logits, targets, focus))


def test_training_offsets_read_later_rows_of_the_position_table():
    torch.manual_seed(0)
    config = LabConfig(seq_len=10, vocab_size=12, d_model=16, num_heads=2, position_offsets=4)
    model = LabModel(config).eval()
    assert model.position.shape == (14, 16)
    ids = torch.randint(0, 12, (2, 10))
    shifted = copy.deepcopy(model)
    with torch.no_grad():
        shifted.position.copy_(torch.roll(model.position, -3, dims=0))
        # Sequence 0 from row 0 as without offsets, sequence 1 from row 3 as a table starting at row 3.
        logits, _ = model(ids, offsets=torch.tensor([0, 3]))
        torch.testing.assert_close(logits[0], model(ids[:1])[0][0])
        torch.testing.assert_close(logits[1], shifted(ids[1:])[0][0])
        assert not torch.allclose(logits[1], model(ids[1:])[0][0])


def test_a_checkpoint_without_the_newer_settings_loads_with_fixed_positions(tmp_path):
    torch.set_num_threads(1)
    old = LabConfig(
        seq_len=12, vocab_size=16, batch_size=8, d_model=16, num_heads=2, position_offsets=0, other_weight=1.0
    )
    lab = Lab(old)
    lab.train(2, score_every=2)
    path = lab.save(tmp_path / "old.pt")
    saved = torch.load(path, weights_only=True)
    del saved["config"]["position_offsets"], saved["config"]["other_weight"]
    torch.save(saved, path)
    loaded = Lab.load(path)
    assert loaded.config == old and loaded.model.position.shape == (12, 16)


def test_a_config_too_large_to_train_is_refused_before_anything_is_allocated():
    from mha_core.lab import MAX_TRAINING_BYTES, LabModel
    from mha_core.operations import training_step_bytes

    # The parameter count is the model's own, for every size the Lab page offers and a few more.
    for sizes in (
        {},
        dict(num_layers=2, num_heads=2, d_model=32, vocab_size=32),
        dict(num_layers=3, mlp=True),
        dict(positions="none", d_model=48, num_heads=3),
        dict(positions="sinusoidal"),
    ):
        config = LabConfig(**sizes)
        assert config.parameter_count() == sum(p.numel() for p in LabModel(config).parameters()), sizes
        assert 0 < training_step_bytes(config) < MAX_TRAINING_BYTES
    for sizes in (dict(d_model=1_000_000_000), dict(num_layers=100_000), dict(num_heads=64, d_model=4096)):
        with pytest.raises(HeadscopeError, match="too large"):
            LabConfig(**sizes)
    with pytest.raises(HeadscopeError, match="seed must be between 0"):
        LabConfig(seed=-1)
