"""How this server behaves: settings from environment variables (``ServerSettings``, read once per process),
the models the sidebar offers, and the process set-up (allocator, torch threads, the metrics kernel)."""

from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass

import torch

from mha_core.analysis import metrics
from mha_core.models import sources
from ui.budget import runs_budget, tune_allocator

LOG = logging.getLogger("headscope.app")

# The sidebar's names for the embedded models; other allowed models are listed by their own name.
MODEL_CHOICES = {
    "minilm": "all-MiniLM-L6-v2 (embedded encoder, 6 x 12 heads)",
    "smollm2": "SmolLM2-135M (embedded decoder, 30 x 9 heads)",
    "mpnet": "all-mpnet-base-v2 (embedded encoder, 12 x 12 heads)",
}
OTHER_MODEL = "other"
ENGINE_LABELS = {"transformers": "transformers", "core": "From-scratch core"}
# A corpus profile's default size from the Roles page, and a class server's cap: the syntactic roles are tested
# on the held-out half of the sentences, and below about 200 sentences no head passes (MiniLM: 0 at 100, 4 heads
# at 400, 6 at the whole split of 2002); 400 take about 6 s for MiniLM and 25 s for SmolLM2 on 2 cores.
PROFILE_SENTENCES = 400


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None or not value.strip() else value.strip().lower() in ("1", "true", "yes", "on")


def _env_int(name: str, default: int, minimum: int = 1) -> int:
    try:
        return max(minimum, int(os.environ.get(name, default)))
    except ValueError:
        LOG.warning("ignoring %s=%r: not a whole number", name, os.environ.get(name))
        return default


def _env_seconds(name: str, default: float, minimum: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        value = float("nan")
    if value != value or value in (float("inf"), float("-inf")):  # not a number: the default
        LOG.warning("ignoring %s=%r: not a number of seconds", name, os.environ.get(name))
        return default
    return max(minimum, value)


@dataclass(frozen=True)
class ServerSettings:
    """How this server behaves; from environment variables (docs/classroom.md), read once per process.

    classroom             HEADSCOPE_CLASSROOM=1: the safe defaults below for a shared server
    allowed_models        HEADSCOPE_ALLOWED_MODELS: comma-separated names, hub ids, folders; "*" = any
                          (default: any; in classroom mode ``sources.CLASSROOM_MODELS``: minilm, smollm2)
    allow_downloads       HEADSCOPE_ALLOW_DOWNLOADS: may a hub id be fetched from the hub (default: yes; not in class)
    cache_budget_bytes    HEADSCOPE_CACHE_BUDGET_MB: the server's memory above its loaded models (default 2048 MB):
                          7/8 for runs and their measurements (cached, being computed, being drawn), 1/8 for
                          the rest (``ui.budget.runs_budget``)
    max_concurrent_runs   HEADSCOPE_MAX_CONCURRENT_RUNS: forward passes at once (default: the number of CPUs; in
                          classroom mode at least heavy_runs + 1, so that light work always has a slot)
    heavy_budget_bytes    HEADSCOPE_HEAVY_BUDGET_MB: the part of the runs budget that heavy work (``ui.budget.
                          WorkClass``) may hold at once; a heavy computation larger than it is refused
                          (default: the whole runs budget; in classroom mode a quarter of it)
    heavy_runs            HEADSCOPE_HEAVY_RUNS: compute slots heavy work may hold at once (default: all of them;
                          in classroom mode half of them, at least 1)
    torch_threads         HEADSCOPE_TORCH_THREADS: torch threads per forward pass (default 1)
    max_profile_sentences HEADSCOPE_MAX_PROFILE_SENTENCES: corpus profile size from the Roles page
                          (default 2002, the whole UD dev split; PROFILE_SENTENCES in classroom mode)
    class_link            HEADSCOPE_PUBLIC_URL: the link students open (scripts/app.sh --classroom sets it)
    student_poll_s        HEADSCOPE_STUDENT_POLL_S: how often a student's screen polls the class (default 2 s, at
                          least 0.25): its safety net, since the wake-up (``ui.class_http.ClassWake``) moves it
                          when the teacher moves
    """

    classroom: bool = False
    allowed_models: tuple[str, ...] | None = None
    allow_downloads: bool = True
    cache_budget_bytes: int = 2048 << 20
    max_concurrent_runs: int = 2
    heavy_budget_bytes: int = runs_budget(2048 << 20)
    heavy_runs: int = 2
    torch_threads: int = 1
    max_profile_sentences: int = 2002
    class_link: str | None = None
    student_poll_s: float = 2.0

    @classmethod
    def from_env(cls) -> ServerSettings:
        classroom = _env_flag("HEADSCOPE_CLASSROOM", False)
        allowed = sources.parse_allowlist(
            os.environ.get("HEADSCOPE_ALLOWED_MODELS", ",".join(sources.CLASSROOM_MODELS) if classroom else "*")
        )
        budget = _env_int("HEADSCOPE_CACHE_BUDGET_MB", 2048) << 20
        slots = _env_int("HEADSCOPE_MAX_CONCURRENT_RUNS", os.cpu_count() or 2)
        heavy_runs = min(_env_int("HEADSCOPE_HEAVY_RUNS", max(1, slots // 2) if classroom else slots), slots)
        if classroom:
            slots = max(slots, heavy_runs + 1)  # light work never waits for heavy work's slots
        heavy_mb = _env_int("HEADSCOPE_HEAVY_BUDGET_MB", runs_budget(budget) // (4 if classroom else 1) >> 20)
        return cls(
            classroom=classroom,
            allowed_models=allowed,
            allow_downloads=_env_flag("HEADSCOPE_ALLOW_DOWNLOADS", not classroom),
            cache_budget_bytes=budget,
            max_concurrent_runs=slots,
            heavy_budget_bytes=min(heavy_mb << 20, runs_budget(budget)),
            heavy_runs=heavy_runs,
            torch_threads=_env_int("HEADSCOPE_TORCH_THREADS", 1),
            max_profile_sentences=_env_int(
                "HEADSCOPE_MAX_PROFILE_SENTENCES", PROFILE_SENTENCES if classroom else 2002, 10
            ),
            class_link=os.environ.get("HEADSCOPE_PUBLIC_URL") or None,
            student_poll_s=_env_seconds("HEADSCOPE_STUDENT_POLL_S", 2.0, 0.25),
        )


@functools.cache
def settings() -> ServerSettings:
    return ServerSettings.from_env()


def model_choices() -> dict[str, str]:
    """What the sidebar offers: the allowed embedded models, the other allowed names, and "other"
    (type any name) only where any model may load."""
    allowed = settings().allowed_models
    choices = {key: label for key, label in MODEL_CHOICES.items() if sources.model_allowed(key, allowed)}
    if allowed is None:
        choices[OTHER_MODEL] = "Other: a hub id or a local folder"
    else:
        choices.update({name: name for name in allowed if sources.normalized_name(name) not in MODEL_CHOICES})
    return choices


def configure_process() -> None:
    """The C allocator returns evicted runs to the system (``ui.budget.tune_allocator``), and one torch
    thread per forward pass by default: a sentence takes ~40 ms either way, but on a busy
    2-core machine two spinning OpenMP threads per run made it 10-30x slower (0.04 s vs 0.8-1.5 s), and
    the server runs each session in its own thread anyway."""
    tune_allocator()
    if torch.get_num_threads() != settings().torch_threads:
        torch.set_num_threads(settings().torch_threads)
    _warm_up_kernels()


@functools.cache
def _warm_up_kernels() -> None:
    """Once per server: the head metrics' compiled kernel is readied in the background, so the first visitor's
    page does not wait for it (4 s on a machine's first start, 0.5 s on later ones)."""

    threading.Thread(target=metrics.warm_up, name="headscope-warm-up", daemon=True).start()
