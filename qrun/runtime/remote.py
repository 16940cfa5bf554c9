"""Filling a `gen` hole on a server that samples whole holes (vLLM's OpenAI-compatible
server): one completion per hole on the context's token ids, its constraint sent as a regex
in the server's dialect (runtime/portable.py), and every returned token replayed through the
same cursor, stop-string and boundary logic as a local hole (generate.py's _Hole), so the
value, the overshoot handling and the checks are qrun's own."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from qrun.backends.base import Completion, HoleSampler
from qrun.runtime.generate import GenRequest, HoleFailure, HoleRecord, _Hole
from qrun.runtime.session import Session

# Legality of a server token is judged by the regex alone: the server knows nothing of
# max_tokens' budget, which is checked once the value is complete.
_UNBOUNDED = 1 << 30


def generate_remote(
    session: Session, sampler: HoleSampler, request: GenRequest, regex: str | None,
    constrained: bool, on_text: Callable[[str], None] | None = None,
) -> HoleRecord:
    """Fill one hole with one server completion and append it to the session's context.

    `regex` is the hole's constraint in the server's dialect (healed prefix first), or None.
    A hole without a constraint of its own sends its stop strings as the server's (the first
    occurrence ends it, as locally), unless one could match across the healed prefix. A
    `constrained` one does not: locally a stop ends such a value only where the text before it
    is a full match, so the server samples under the regex alone. Either way the replay finds
    the stop by qrun's rule and ignores the tokens after it.

    Raises:
        HoleFailure: the server's value breaks the constraint or does not complete it within
            max_tokens.
    """
    started = time.perf_counter()
    session.settle()
    session.ensure_start()
    hole = _Hole(session, request)
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=request.generator).item()) \
        if request.generator is not None else 0
    sampling = request.sampling
    # A token wholly inside the healed text is free locally (it gives back the template's
    # own text); the server counts every token, so it gets one more and the replay stops at
    # max_tokens value tokens.
    limit = request.max_tokens + (1 if request.prefix else 0)
    t0 = time.perf_counter()
    server_stops = () if constrained or _overlaps(request.prefix, request.stop) else request.stop
    completion = sampler.complete(
        list(session.token_ids), limit, temperature=sampling.temperature,
        top_p=sampling.top_p, top_k=sampling.top_k, seed=seed, stop=server_stops, regex=regex)
    stats = session.stats
    stats.model_s += time.perf_counter() - t0
    stats.forward_calls += 1
    stats.forward_tokens += completion.computed
    stats.cached_tokens += completion.cached
    finish = _replay(hole, request, completion)
    record = hole.record
    record.finish = finish
    cursor = request.cursor
    if cursor is not None and finish != "stop" and not cursor.can_end():
        raise HoleFailure(
            f"hole '{request.name}': the server's value does not complete the constraint "
            f"within {request.max_tokens} token(s) ({finish}); value so far: {hole.value()!r}")
    record.value = hole.value()
    if on_text is not None and record.value:
        on_text(record.value)
    record.seconds = time.perf_counter() - started
    return record


def _overlaps(prefix: bytes, stops: tuple[str, ...]) -> bool:
    """Whether a stop string could be found in text that begins inside the healed prefix. qrun
    looks for stops after it; a server looks in all it wrote (a chat turn's healed "\n" with
    stop="\n" would end every hole at once), so such stops stay with the replay."""
    for stop in stops:
        data = stop.encode("utf-8")
        if data in prefix or any(prefix.endswith(data[:k]) for k in range(1, len(data))):
            return True
    return False


def _replay(hole: _Hole, request: GenRequest, completion: Completion) -> str:
    """Take the server's tokens into the hole one by one, checking each against the cursor;
    returns the finish reason."""
    logprobs = completion.logprobs
    cursor = request.cursor
    for k, token in enumerate(completion.token_ids):
        if hole.value_tokens >= request.max_tokens:
            return "max_tokens"  # the rest ran past the budget: a local run stops here too
        if cursor is not None and not bool(cursor.allowed(_UNBOUNDED)[token]):
            raise HoleFailure(
                f"hole '{request.name}': the server's token {k + 1} "
                f"({hole.vocab.token_bytes[token]!r}) breaks the constraint; value so far: "
                f"{hole.value()!r}")
        hole.session.stats.generated_tokens += 1
        stop_at = hole.take(token, logprobs[k] if k < len(logprobs) else float("nan"),
                            forced=False)
        if stop_at is not None:
            hole.cut_at_stop(stop_at)
            return "stop"
        if cursor is not None and not cursor.can_continue():
            return "match"
    # Ended without a stop string qrun found: by EOS, by the token limit, or by a stop the
    # server matched where qrun's rule does not (inside the healed text): the value ends here.
    return "max_tokens" if completion.finish == "length" else "eos"
