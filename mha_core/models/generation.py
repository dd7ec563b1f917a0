"""A decoder writes: token by token with the key/value cache, every head's attention kept at each step.

``generate`` returns one ``AttentionRun`` over the prompt and the tokens written, whose attentions are those of
one forward pass over the final sequence (a decoder's row depends only on the tokens before it: the prompt's
rows come from the first pass, each new token's row from its own step). ``metadata["generation"]`` says which
positions were written and, for each, the distribution it was drawn from (``sampling_distribution``): the most
likely tokens with the model's probability (softmax of its logits) and the sampling probability (after the
temperature, top-k and top-p), and the chosen token. ``model`` is a ``LoadedModel`` (``models.loaded``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from ..errors import HeadscopeError, InputTextError
from ..progress import Progress, report
from ..run import AttentionRun
from .prediction import check_predicts

# The most tokens one call writes (each step's attention row is kept: the run grows as n^2).
MAX_NEW_TOKENS = 256
# How many of the most likely tokens each step keeps.
STEP_KEPT = 10


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ``InputTextError`` for a temperature below 0, a top-k below 1 or a top-p outside (0, 1]."""
    if not temperature >= 0:  # also NaN
        raise InputTextError(f"The temperature must be 0 (greedy) or more, got {temperature}.")
    if top_k is not None and int(top_k) < 1:
        raise InputTextError(f"top-k must be at least 1, got {top_k}.")
    if top_p is not None and not 0 < top_p <= 1:
        raise InputTextError(f"top-p must be above 0 and at most 1, got {top_p}.")


def sampling_distribution(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """The distribution a token is drawn from, ``[vocab]`` float32, from one position's logits: temperature 0 puts
    all the mass on the most likely token (greedy); otherwise softmax(logits / temperature), kept to the ``top_k``
    most likely tokens and then to the smallest set of most likely tokens whose probability reaches ``top_p``
    (nucleus sampling, Holtzman et al. 2020), renormalised."""
    check_sampling(temperature, top_k, top_p)
    logits = logits.detach().float().reshape(-1)
    if temperature == 0:
        chosen = torch.zeros_like(logits)
        chosen[int(logits.argmax())] = 1.0
        return chosen
    probabilities = torch.softmax(logits / float(temperature), dim=-1)
    order = torch.argsort(probabilities, descending=True, stable=True)
    keep = torch.ones_like(probabilities, dtype=torch.bool)
    if top_k is not None and int(top_k) < probabilities.numel():
        keep[order[int(top_k) :]] = False
    if top_p is not None and top_p < 1:
        sorted_probabilities = probabilities[order] * keep[order]
        before = torch.cumsum(sorted_probabilities, 0) - sorted_probabilities  # mass of the tokens ranked above
        keep[order[before >= top_p * sorted_probabilities.sum()]] = False
    kept = probabilities * keep
    return kept / kept.sum()


def stop_ids(model, stop) -> tuple[int, ...]:
    """The token ids that end a generation: None means the tokenizer's end-of-text token (if any); otherwise ids or
    token strings (as the vocabulary spells them)."""
    tokenizer = model.tokenizer
    if stop is None:
        return () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)
    items = [stop] if isinstance(stop, (int, str)) else list(stop)
    ids = []
    vocab = tokenizer.get_vocab()
    for item in items:
        if isinstance(item, str):
            if item not in vocab:
                raise InputTextError(f"The stop token {item!r} is not in {model.name}'s vocabulary.")
            ids.append(int(vocab[item]))
        else:
            ids.append(int(item))
    return tuple(ids)


def _step_record(logits: torch.Tensor, sampling: torch.Tensor, chosen: int, position: int) -> dict:
    """One step, as plain lists a run's metadata can save."""
    probabilities = torch.softmax(logits.float(), dim=-1)
    top = torch.topk(probabilities, min(STEP_KEPT, probabilities.numel())).indices
    return {
        "position": int(position),
        "ids": [int(i) for i in top],
        "probabilities": [float(probabilities[i]) for i in top],
        "sampling": [float(sampling[i]) for i in top],
        "chosen": int(chosen),
        "chosen_probability": float(probabilities[chosen]),
        "chosen_sampling_probability": float(sampling[chosen]),
    }


def _layer_rows(attentions: Sequence[torch.Tensor]) -> torch.Tensor:
    """A step's attentions (one ``[1, H, q, k]`` per layer) as ``[L, H, q, k]``."""
    if not attentions or any(layer is None for layer in attentions):
        raise HeadscopeError("The model returned no attention weights while generating (it needs eager attention).")
    return torch.stack([layer[0].float() for layer in attentions])


def generate(
    model,
    prompt,
    max_new_tokens: int = 20,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    stop=None,
    progress: Progress | None = None,
    bos: bool | None = None,
) -> AttentionRun:
    """The decoder continues ``prompt`` (a text or an ``EncodedText``) by up to ``max_new_tokens`` tokens.

    Each token is drawn from ``sampling_distribution`` (temperature 0: greedy, the most likely token, as
    transformers' ``generate(do_sample=False)``) with a ``torch.Generator`` seeded by ``seed`` (the same seed
    writes the same tokens, and n + 1 tokens begin with the n tokens of n); a token of ``stop`` ends it after
    being written (None: the end-of-text token; ``()``: none). The checkpoint's own layers with a key/value cache,
    one token per step; each layer's attention row of the new token is kept. ``progress`` counts the prompt's
    pass and each step, and may raise to stop. Returns the run over prompt + written tokens;
    ``metadata["generation"]``: ``prompt_tokens``, ``generated`` (positions), ``steps`` (one ``_step_record``
    each), the settings and ``stopped`` (``"stop token"``, ``"maximum"`` or ``"length"``: the model's limit)."""
    from transformers import DynamicCache  # transformers: imported on first use, as in models.loading

    check_predicts(model)
    if not model.is_causal or model.lm_head_kind != "causal":
        raise HeadscopeError(f"{model.name!r} does not write text: generation needs a decoder with its head.")
    check_sampling(temperature, top_k, top_p)
    if not 0 <= int(max_new_tokens) <= MAX_NEW_TOKENS:
        raise InputTextError(f"max_new_tokens must be between 0 and {MAX_NEW_TOKENS}, got {max_new_tokens}.")
    encoded = model.encode(prompt, bos=bos)
    ends = set(stop_ids(model, stop))
    room = model.max_tokens - len(encoded)
    if room < 1 and max_new_tokens > 0:
        raise InputTextError(f"The prompt fills the model's {model.max_tokens} tokens: no room to write.")
    steps = min(int(max_new_tokens), room)
    generator = torch.Generator().manual_seed(int(seed))
    ids = list(encoded.input_ids)
    prompt_tokens = len(ids)
    total = steps + 1
    weights = torch.zeros(model.num_layers, model.num_heads, prompt_tokens + steps, prompt_tokens + steps)
    records: list[dict] = []
    stopped = "maximum" if steps == int(max_new_tokens) else "length"
    with model.forward_lock, torch.inference_mode():
        cache = DynamicCache()
        output = model.hf_model(
            input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True, output_attentions=True
        )
        weights[:, :, :prompt_tokens, :prompt_tokens] = _layer_rows(output.attentions)
        report(progress, 1, total, "reading the prompt")
        for step in range(steps):
            logits = model.logits(output.last_hidden_state[0, -1])
            sampling = sampling_distribution(logits, temperature, top_k, top_p)
            chosen = (
                int(torch.multinomial(sampling, 1, generator=generator)) if temperature > 0 else int(sampling.argmax())
            )
            records.append(_step_record(logits, sampling, chosen, len(ids)))
            ids.append(chosen)
            output = model.hf_model(
                input_ids=torch.tensor([[chosen]]), past_key_values=cache, use_cache=True, output_attentions=True
            )
            n = len(ids)
            weights[:, :, n - 1, :n] = _layer_rows(output.attentions)[:, :, 0]
            report(progress, step + 2, total, f"token {step + 1} of {steps}")
            if chosen in ends:
                stopped = "stop token"
                break
    n = len(ids)
    vocab = model.hf_model.get_input_embeddings().num_embeddings
    whole = dataclasses.replace(model.encoder.encode_ids(ids, vocab), added_bos=encoded.added_bos)
    generation = {
        "prompt_tokens": prompt_tokens,
        "generated": list(range(prompt_tokens, n)),
        "steps": records,
        "temperature": float(temperature),
        "top_k": None if top_k is None else int(top_k),
        "top_p": None if top_p is None else float(top_p),
        "seed": int(seed),
        "stopped": stopped,
    }
    return model.attention_run(whole, weights[:, :, :n, :n].contiguous(), generation=generation)
