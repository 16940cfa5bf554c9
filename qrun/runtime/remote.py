"""Filling a `gen` hole on a server that samples whole holes (vLLM's OpenAI-compatible
server): one completion per hole on the context's token ids, its constraint sent as a regex in
the server's dialect (regex/portable.py) or, for json= and grammar= holes, as the same
llguidance Lark text qrun compiles (qrun/llg; only to a server that samples it with
llguidance), and every returned token replayed through the same cursor, stop-string and
boundary logic as a local hole (hole.py), so the value, the overshoot handling and the checks
are qrun's own. The hole filler of backends with a HoleSampler."""

from __future__ import annotations

import time
from collections.abc import Callable

from qrun.backends.base import Completion, HoleSampler
from qrun.constraint import ConstraintSpec
from qrun.constraint.grammar import with_prefix
from qrun.constraint.spec import LLGUIDANCE
from qrun.regex import PatternError, portable_regex
from qrun.runtime.hole import GenRequest, Hole, HoleFailure, follow_of
from qrun.runtime.result import GenRecord
from qrun.runtime.session import Session

# Legality of a server token is judged by the regex alone: the server knows nothing of
# max_tokens' budget, which is checked once the value is complete.
_UNBOUNDED = 1 << 30


class ServerFiller:
    """The server replay: one completion per hole, every token checked by qrun."""

    def __init__(self, sampler: HoleSampler) -> None:
        self.sampler = sampler

    def fill(self, session: Session, request: GenRequest,
             on_text: Callable[[str], None] | None = None) -> GenRecord:
        return generate_remote(session, self.sampler, request, on_text)

    def refuses(self, constraint: ConstraintSpec) -> str | None:
        if constraint.engine == LLGUIDANCE:
            if self.sampler.reads_llguidance():
                return None
            return ("this constraint cannot be sent to the server: its structured outputs do "
                    "not run llguidance (start vLLM with the default backend, or with "
                    "--structured-outputs-config '{\"backend\": \"guidance\"}')")
        try:
            server_regex(constraint.pattern, b"")
        except PatternError as exc:
            return f"this constraint cannot be sent to the server: {exc}"
        return None


def server_regex(pattern: str | None, prefix: bytes, follow: bytes = b"") -> str | None:
    """The hole's constraint (healed prefix first) as a regex a server reads the way qrun does,
    then any beginning of `follow` (where the template's next text may end the hole); None for
    an unconstrained hole with nothing healed.

    Raises:
        PatternError: the pattern has no faithful form in the server's dialect.
    """
    if pattern is None and not prefix:
        return None
    return portable_regex("[\\s\\S]*" if pattern is None else pattern, prefix.decode("utf-8"),
                          _whole_chars(follow))


def _whole_chars(data: bytes) -> str:
    """`data` decoded, less a last character it cuts (the beginning of a text)."""
    return data.decode("utf-8", errors="ignore") if data else ""


def generate_remote(
    session: Session, sampler: HoleSampler, request: GenRequest,
    on_text: Callable[[str], None] | None = None,
) -> GenRecord:
    """Fill one hole with one server completion and append it to the session's context.

    The constraint goes to the server in its dialect (healed prefix first). A hole without a
    constraint of its own sends its stop strings as the server's (the first occurrence ends it,
    as locally), unless one could match across the healed prefix. A constrained one does not:
    locally a stop ends such a value only where the text before it is a full match, so the
    server samples under the regex alone. Either way the replay finds the stop by qrun's rule
    and ignores the tokens after it.

    Raises:
        HoleFailure: the constraint has no form the server reads as qrun does, or the server's
            value breaks the constraint or does not complete it within max_tokens.
    """
    session.settle()
    session.ensure_start()
    hole = Hole(session, request)
    constraint = request.constraint
    pattern = constraint.pattern if constraint is not None else None
    regex: str | None = None
    grammar: str | None = None
    # The server may also write the beginning of the text after the hole, where the value is
    # complete; the replay ends the hole at it as a local run does (docs/language.md §14.5).
    follow_at = follow_of(session, request.follow)
    follow = follow_at.plain
    # Without a constraint, a token that begins the next text ends the hole (as locally): the
    # server stops after one, and the replay ends the value before it. The server is not told
    # of one that fits inside the healed prefix (it may be the prefix itself, which does not
    # end the hole); the replay still ends the value at it once the prefix is written.
    ends = follow_at.whole if constraint is None else ()
    server_ends = tuple(t for t in ends if not _inside_prefix(hole, t))
    if constraint is not None and constraint.engine == LLGUIDANCE:
        # The text the local cursor compiled: the server's llguidance reads it the same way.
        grammar = with_prefix(constraint.pattern, request.prefix.decode("utf-8", "replace"),
                              _whole_chars(follow))
    else:
        try:
            regex = server_regex(pattern, request.prefix, follow)
        except PatternError as exc:
            raise HoleFailure(f"this constraint cannot be sent to the server: {exc}") from None
    seed = int(request.generator.integers(0, 2**31 - 1)) \
        if request.generator is not None else 0
    sampling = request.sampling
    # A token wholly inside the healed text is free locally (it gives back the template's
    # own text); the server counts every token, so it gets one more and the replay stops at
    # max_tokens value tokens.
    limit = request.max_tokens + (1 if request.prefix else 0)
    t0 = time.perf_counter()
    server_stops = () if pattern is not None or overlaps(request.prefix, request.stop) \
        else request.stop
    completion = sampler.complete(
        list(session.token_ids), limit, temperature=sampling.temperature,
        top_p=sampling.top_p, top_k=sampling.top_k, seed=seed, stop=server_stops, regex=regex,
        grammar=grammar, stop_token_ids=server_ends, extra=sampling.server_fields())
    session.count_model_call(time.perf_counter() - t0, completion.computed, completion.cached)
    finish = _replay(hole, request, completion, follow, frozenset(ends))
    record = hole.finish(finish, f"the server's value does not complete the constraint within "
                                 f"{request.max_tokens} token(s)")
    if on_text is not None and record.text:
        on_text(record.text)
    return record


def overlaps(prefix: bytes, stops: tuple[str, ...]) -> bool:
    """Whether a stop string could be found in text that begins inside the healed prefix. qrun
    looks for stops after it; a server looks in all it wrote (a chat turn's healed "\\n" with
    stop="\\n" would end every hole at once), so such stops stay with the replay."""
    for stop in stops:
        data = stop.encode("utf-8")
        if data in prefix or any(prefix.endswith(data[:k]) for k in range(1, len(data))):
            return True
    return False


def _replay(hole: Hole, request: GenRequest, completion: Completion, follow: bytes,
            ends: frozenset[int] = frozenset()) -> str:
    """Take the server's tokens into the hole one by one, checking each against the cursor;
    returns the finish reason. A token the constraint does not allow may begin `follow`, the
    text after the hole, where the value before it is complete: the hole ends there. Without
    a constraint, a token of `ends` (one that begins `follow`) ends it."""
    logprobs = completion.logprobs
    cursor = request.cursor
    for k, token in enumerate(completion.token_ids):
        if hole.value_tokens >= request.max_tokens:
            return "max_tokens"  # the rest ran past the budget: a local run stops here too
        logprob = logprobs[k] if k < len(logprobs) else None
        if token in ends and not hole.in_prefix():
            hole.session.stats.generated_tokens += 1
            hole.end_at_boundary(token, logprob)
            return "boundary"
        if cursor is not None and not bool(cursor.allowed(_UNBOUNDED)[token]):
            value_bytes = _value_before_follow(hole, token, follow)
            if value_bytes is not None:
                hole.session.stats.generated_tokens += 1
                hole.end_at_boundary(token, logprob, value_bytes)
                return "boundary"
            raise HoleFailure(
                f"hole '{request.name}': the server's token {k + 1} "
                f"({hole.vocab.token_bytes[token]!r}) breaks the constraint; value so far: "
                f"{hole.value()!r}")
        hole.session.stats.generated_tokens += 1
        stop_at = hole.take(token, logprob, forced=False)
        if stop_at is not None:
            hole.cut_at_stop(stop_at)
            return "stop"
        if cursor is not None and not cursor.can_continue():
            return "match"
    # Ended without a stop string qrun found: by EOS, by the token limit, or by a stop the
    # server matched where qrun's rule does not (inside the healed text): the value ends here.
    return "max_tokens" if completion.finish == "length" else "eos"


def _inside_prefix(hole: Hole, token: int) -> bool:
    """Whether `token`'s bytes fit inside the healed prefix (it may be written to give it)."""
    data = hole.vocab.token_bytes[token] or b""
    return bool(data) and hole.request.prefix.startswith(data)


def _value_before_follow(hole: Hole, token: int, follow: bytes) -> bytes | None:
    """The bytes of `token` that end the value when the rest of them begin `follow` and the
    value with them is a full match (the longest such, since value text comes first), or
    None when the token does not end the hole so."""
    data = hole.vocab.token_bytes[token]
    cursor = hole.request.cursor
    if not data or not follow or cursor is None or hole.in_prefix():
        return None
    for cut in range(len(data) - 1, -1, -1):
        if follow.startswith(data[cut:]) and cursor.accepts(bytes(hole.text) + data[:cut]):
            return data[:cut]
    return None
