"""Prompt pairs with a known story for logit attribution and patching, each one SmolLM2-135M gets right.

Each task is a clean prompt, a corrupted prompt of the same number of tokens that changes the answer, the
answer (the clean prompt's right next token) and the foil (the corrupted prompt's). The logit differences are
SmolLM2's own (answer minus foil, at the last position), measured on the shipped weights and checked by
tests/mha_core/interventions/test_circuits.py; docs/circuits.md tells the story of each and where SmolLM2 fails.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CircuitTask:
    name: str
    title: str
    story: str  # what the model has to do, in one sentence
    clean: str
    corrupted: str
    answer: str
    foil: str
    clean_difference: float  # SmolLM2's logit(answer) - logit(foil) on the clean prompt
    corrupted_difference: float  # ... and on the corrupted prompt


CIRCUIT_TASKS = (
    CircuitTask(
        name="ioi",
        title="Indirect object (Wang et al. 2023)",
        story="Two names; the one who gives is named again, so the drink goes to the other one.",
        clean="When Mary and John went to the store, John gave a drink to",
        corrupted="When Mary and John went to the store, Mary gave a drink to",
        answer=" Mary",
        foil=" John",
        clean_difference=5.2873,
        corrupted_difference=-5.0470,
    ),
    CircuitTask(
        name="induction",
        title="Induction on repeated random words",
        story="Eight random words, then the first five again: the next word is the one that followed last time.",
        clean=" imagination higher propeller faction poem reinforcements statistically multiples imagination higher "
        "propeller faction poem",
        corrupted=" imagination higher propeller faction poem deck statistically multiples imagination higher "
        "propeller faction poem",
        answer=" reinforcements",
        foil=" deck",
        clean_difference=6.5911,
        corrupted_difference=-14.7016,
    ),
    CircuitTask(
        name="capital",
        title="A fact: a country's capital",
        story="Recall a fact: the capital of the country named.",
        clean="The capital of France is",
        corrupted="The capital of Italy is",
        answer=" Paris",
        foil=" Rome",
        clean_difference=6.2128,
        corrupted_difference=-6.6012,
    ),
    CircuitTask(
        name="counting",
        title="Counting in words",
        story="Continue the count: after four comes five (after five, six).",
        clean="one, two, three, four,",
        corrupted="one, two, three, five,",
        answer=" five",
        foil=" six",
        clean_difference=0.7955,
        corrupted_difference=-0.9892,
    ),
)
TASKS_BY_NAME = {task.name: task for task in CIRCUIT_TASKS}

# Measured where SmolLM2 fails (answer minus foil; negative: the wrong one is preferred), shown beside the tasks.
SMOLLM2_FAILURES = (
    (
        "Monday, Tuesday, Wednesday,",
        " Thursday",
        " Friday",
        -0.9642,
        "the next weekday: it prefers ' Friday' to ' Thursday' (and ' and' to both)",
    ),
    (
        "Mary has three apples and John has four apples. Together they have",
        " seven",
        " five",
        -1.2614,
        "adding: with three and four apples it still prefers ' five' to ' seven', as with three and two",
    ),
)
