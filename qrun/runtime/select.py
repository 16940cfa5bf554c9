"""Filling a `select` hole: every option scored in full, in context, in one batched forward on
top of the current KV cache; the chosen option's row of that batch becomes the context, so the
winner is never encoded twice."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from qrun.backends.base import BatchScorer
from qrun.runtime.generate import HoleFailure, HoleRecord
from qrun.runtime.session import Session


@dataclass(frozen=True, slots=True)
class SelectRequest:
    """A `select` hole with its arguments evaluated."""

    name: str
    options: tuple[str, ...]
    temperature: float
    normalize: str  # "sum" | "mean"
    generator: torch.Generator | None
    prefix: str = ""  # healed text taken back from the context; every option starts with it


def select(session: Session, request: SelectRequest) -> HoleRecord:
    """Score every option and append the chosen one to the context.

    Raises:
        HoleFailure: the backend cannot score options, or an option has no tokens.
    """
    started = time.perf_counter()
    backend = session.backend
    if not isinstance(backend, BatchScorer):
        raise HoleFailure(f"backend '{backend.name}' cannot score select options")
    # With healing, each row is the canonical tokenization of prefix + option, so an option
    # after "Paid: " is scored as " yes", not as "yes" glued to a lone space token. The
    # prefix is common text, so comparing P(prefix + option) compares the options.
    rows = [backend.encode(request.prefix + option) for option in request.options]
    for option, row in zip(request.options, rows, strict=True):
        if not row:
            raise HoleFailure(f"select '{request.name}': option {option!r} has no tokens")
    first = torch.log_softmax(session.next_logits(), dim=-1)  # [V], after the whole context
    session.sync()
    prefix = len(session.token_ids)
    t0 = time.perf_counter()
    logits, batched = backend.forward_rows(rows, session.cache)  # [n, L, V]
    session.stats.model_s += time.perf_counter() - t0
    session.stats.forward_calls += 1
    session.stats.forward_tokens += sum(len(row) for row in rows)
    token_logprobs = _token_logprobs(first, logits, rows)
    scores = {
        option: _score(lps, request.normalize)
        for option, lps in zip(request.options, token_logprobs, strict=True)
    }
    chosen = _choose(list(scores.values()), request.temperature, request.generator)
    row = rows[chosen]
    # The winner's positions stay; every loser's were computed for nothing.
    session.stats.rollback_tokens += sum(len(r) for i, r in enumerate(rows) if i != chosen)
    session.extend_fed(row, backend.keep_row(batched, chosen, prefix + len(row)),
                       logits[chosen, len(row) - 1])
    session.stats.generated_tokens += len(row)
    return HoleRecord(
        name=request.name,
        value=request.options[chosen],
        token_ids=list(row),
        logprobs=token_logprobs[chosen],
        forced=[False] * len(row),
        finish="select",
        seconds=time.perf_counter() - started,
        option_logprobs={
            o: sum(lps) for o, lps in zip(request.options, token_logprobs, strict=True)
        },
    )


def _token_logprobs(
    first: torch.Tensor, logits: torch.Tensor, rows: list[list[int]]
) -> list[list[float]]:
    # Token k of a row is predicted by position k-1 of that row (position -1 = the context).
    logprobs = torch.log_softmax(logits, dim=-1)  # [n, L, V]
    out = []
    for i, row in enumerate(rows):
        values = [float(first[row[0]])]
        values += [float(logprobs[i, k - 1, row[k]]) for k in range(1, len(row))]
        out.append(values)
    return out


def _score(logprobs: list[float], normalize: str) -> float:
    total = sum(logprobs)
    return total / len(logprobs) if normalize == "mean" else total


def _choose(scores: list[float], temperature: float, generator: torch.Generator | None) -> int:
    if temperature == 0.0:
        best = max(scores)
        return scores.index(best)  # first option wins ties
    weights = torch.tensor([s / temperature for s in scores], dtype=torch.float64)
    probs = torch.softmax(weights, dim=0)
    if not math.isfinite(float(probs.sum())):
        return scores.index(max(scores))
    return int(torch.multinomial(probs, 1, generator=generator).item())
