"""The run trace format (docs/trace.md): typed shapes of a trace as JSON-compatible data, and
`validate`, the one check every writer runs before a trace leaves the process. Torch-free:
imports the standard library only, so a trace can be read and rendered anywhere."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal, NotRequired, TypeAlias, TypedDict, cast

FORMAT = "qrun-trace"
VERSION = 1

JSONValue: TypeAlias = (
    "None | bool | int | float | str | list[JSONValue] | dict[str, JSONValue]"
)

TokenKind = Literal["fixed", "sampled", "forced", "healed", "select"]
DropReason = Literal["stop", "boundary", "heal", "select", "rollback"]
Finish = Literal["stop", "eos", "max_tokens", "match", "boundary", "select", "filled"]
HoleKind = Literal["gen", "select"]

TOKEN_KINDS: tuple[TokenKind, ...] = ("fixed", "sampled", "forced", "healed", "select")
DROP_REASONS: tuple[DropReason, ...] = ("stop", "boundary", "heal", "select", "rollback")
FINISHES: tuple[Finish, ...] = ("stop", "eos", "max_tokens", "match", "boundary", "select",
                                "filled")
HOLE_KINDS: tuple[HoleKind, ...] = ("gen", "select")

# A log-probability is ≤ 0; rounding to 6 places (Stats.to_dict, HoleRecord.to_dict) can make
# a certain token's -1e-9 read as 0.0, and float32 softmax can overshoot by a few ulps.
_LOGPROB_SLACK = 1e-4


class TopToken(TypedDict):
    id: int
    text: str
    logprob: float


class TokenEvent(TypedDict):
    pos: int
    id: int
    text: str
    kind: TokenKind
    kept: bool
    dropped_by: DropReason | None
    cached: bool
    hole: int | None
    logprob: float | None
    prob: float | None
    mask_size: int | None
    top: list[TopToken]
    option: NotRequired[int | None]


class SourcePos(TypedDict):
    line: int
    column: int


class SelectOption(TypedDict):
    text: str
    logprob: float
    prob: float


class ValueShare(TypedDict):
    text: str
    prob: float


class ParticleShare(TypedDict):
    text: str
    weight: float


class Hole(TypedDict):
    index: int
    name: str
    kind: HoleKind
    constraint: str | None
    value: JSONValue
    text: str
    finish: Finish
    seconds: float
    span: SourcePos
    first_event: int | None
    last_event: int | None
    options: list[SelectOption] | None
    context: NotRequired[str | None]
    values: NotRequired[list[ValueShare]]
    log_evidence: NotRequired[float | None]
    particles: NotRequired[list[ParticleShare]]


class Call(TypedDict):
    name: str
    args: list[JSONValue]
    kwargs: dict[str, JSONValue]
    result: JSONValue
    error: str | None
    seconds: float
    span: SourcePos
    pos: int
    context: NotRequired[str | None]


class BlockParticle(TypedDict):
    values: dict[str, JSONValue]
    weight: float
    error: str | None


class ParticleBlock(TypedDict):
    span: SourcePos
    chosen: int
    log_evidence: float | None
    particles: list[BlockParticle]


class Trace(TypedDict):
    format: str
    version: int
    template: str
    model: str
    backend: str
    device: str | None
    dtype: str | None
    text: str
    stats: dict[str, int | float | None]
    events: list[TokenEvent]
    holes: list[Hole]
    calls: NotRequired[list[Call]]
    particle_blocks: NotRequired[list[ParticleBlock]]


class TraceFormatError(ValueError):
    """A trace that does not follow docs/trace.md; the message names the field's path
    (`events[12].prob`). A ValueError: it is a bug in the trace's writer, not a user error."""


def validate(trace: object) -> Trace:
    """Check a trace's shape, its null rules and that every number is finite; return it typed.
    Keys the format does not name are allowed (readers ignore them)."""
    top = _mapping(trace, "trace")
    if top.get("format") != FORMAT:
        raise TraceFormatError(f"trace.format: expected {FORMAT!r}, got {top.get('format')!r}")
    if top.get("version") != VERSION:
        raise TraceFormatError(f"trace.version: expected {VERSION}, got {top.get('version')!r}")
    for key in ("template", "model", "backend", "text"):
        _field(top, key, str, "trace")
    for key in ("device", "dtype"):
        _field(top, key, str, "trace", nullable=True)
    stats = _mapping(top.get("stats"), "trace.stats")
    for key, value in stats.items():
        if not isinstance(key, str):
            raise TraceFormatError(f"trace.stats: key {key!r} is not a string")
        if value is not None:
            _number(value, f"trace.stats.{key}")
    events = _sequence(top.get("events"), "trace.events")
    holes = _sequence(top.get("holes"), "trace.holes")
    kept = 0
    for i, event in enumerate(events):
        path = f"events[{i}]"
        checked = _check_event(event, path, len(holes))
        # The kept events, in order, are the final context: the k-th one sits at position k.
        if checked["kept"]:
            if checked["pos"] != kept:
                raise TraceFormatError(f"{path}.pos: a kept token at {kept} in the final context")
            kept += 1
    _check_holes(holes, len(events))
    _check_options(events, holes)
    if "calls" in top:  # host function calls (docs/trace.md §2.4); absent in older traces
        _check_calls(_sequence(top["calls"], "trace.calls"))
    if "particle_blocks" in top:  # runs with `{% particles %}` blocks only (docs/trace.md §2.5)
        _check_blocks(_sequence(top["particle_blocks"], "trace.particle_blocks"))
    return cast(Trace, trace)


def _check_blocks(blocks: Sequence[object]) -> None:
    for i, obj in enumerate(blocks):
        path = f"particle_blocks[{i}]"
        block = _mapping(obj, path)
        span = _mapping(block.get("span"), f"{path}.span")
        _index(span, "line", f"{path}.span")
        _index(span, "column", f"{path}.span")
        if block.get("log_evidence") is not None:
            _number(block["log_evidence"], f"{path}.log_evidence")
        particles = _sequence(block.get("particles"), f"{path}.particles")
        chosen = _index(block, "chosen", path)
        if not particles or chosen is None or chosen >= len(particles):
            raise TraceFormatError(f"{path}.chosen: not one of its {len(particles)} particles")
        for k, item in enumerate(particles):
            where = f"{path}.particles[{k}]"
            particle = _mapping(item, where)
            _json_value(_mapping(particle.get("values"), f"{where}.values"), f"{where}.values")
            _probability(particle, "weight", where)
            _field(particle, "error", str, where, nullable=True)


def _check_calls(calls: Sequence[object]) -> None:
    for i, obj in enumerate(calls):
        path = f"calls[{i}]"
        call = _mapping(obj, path)
        _field(call, "name", str, path)
        _field(call, "error", str, path, nullable=True)
        _sequence(call.get("args"), f"{path}.args")
        _mapping(call.get("kwargs"), f"{path}.kwargs")
        for key in ("args", "kwargs", "result"):
            _json_value(call.get(key), f"{path}.{key}")
        if _number(call.get("seconds"), f"{path}.seconds") < 0:
            raise TraceFormatError(f"{path}.seconds: must be ≥ 0")
        span = _mapping(call.get("span"), f"{path}.span")
        _index(span, "line", f"{path}.span")
        _index(span, "column", f"{path}.span")
        _index(call, "pos", path)
        if "context" in call:  # absent in traces written before branches existed
            _field(call, "context", str, path, nullable=True)


def _check_event(obj: object, path: str, n_holes: int) -> Mapping[str, object]:
    event = _mapping(obj, path)
    _index(event, "pos", path)
    _index(event, "id", path)
    _field(event, "text", str, path)
    _choice(event, "kind", TOKEN_KINDS, path)
    kept = _field(event, "kept", bool, path)
    _field(event, "cached", bool, path)
    dropped_by = event.get("dropped_by")
    if kept and dropped_by is not None:
        raise TraceFormatError(f"{path}.dropped_by: must be null for a kept token")
    if not kept:
        _choice(event, "dropped_by", DROP_REASONS, path)
    hole = _index(event, "hole", path, nullable=True)
    if hole is not None and hole >= n_holes:
        raise TraceFormatError(f"{path}.hole: {hole} is not an index into holes")
    logprob = _logprob(event, "logprob", path, nullable=True)
    prob = _probability(event, "prob", path, nullable=True)
    if (logprob is None) != (prob is None):
        raise TraceFormatError(f"{path}: logprob and prob must be both null or both numbers")
    mask_size = _index(event, "mask_size", path, nullable=True)
    if mask_size == 0:
        raise TraceFormatError(f"{path}.mask_size: a mask that allows no token")
    option = event.get("option")
    if event["kind"] == "select":
        if hole is None:
            raise TraceFormatError(f"{path}.hole: a select token belongs to a select hole")
        _index(event, "option", path)
    elif option is not None:
        raise TraceFormatError(f"{path}.option: only select tokens name an option")
    for j, alt in enumerate(_sequence(event.get("top"), f"{path}.top")):
        alt_path = f"{path}.top[{j}]"
        alt_map = _mapping(alt, alt_path)
        _index(alt_map, "id", alt_path)
        _field(alt_map, "text", str, alt_path)
        _logprob(alt_map, "logprob", alt_path)
    return event


def _check_holes(holes: Sequence[object], n_events: int) -> None:
    previous_last = -1
    for i, obj in enumerate(holes):
        path = f"holes[{i}]"
        hole = _mapping(obj, path)
        if _index(hole, "index", path) != i:
            raise TraceFormatError(f"{path}.index: must be its position in holes ({i})")
        _field(hole, "name", str, path)
        kind = _choice(hole, "kind", HOLE_KINDS, path)
        _field(hole, "constraint", str, path, nullable=True)
        _json_value(hole.get("value"), f"{path}.value")
        _field(hole, "text", str, path)
        _choice(hole, "finish", FINISHES, path)
        seconds = _number(hole.get("seconds"), f"{path}.seconds")
        if seconds < 0:
            raise TraceFormatError(f"{path}.seconds: negative")
        span = _mapping(hole.get("span"), f"{path}.span")
        _index(span, "line", f"{path}.span")
        _index(span, "column", f"{path}.span")
        first = _index(hole, "first_event", path, nullable=True)
        last = _index(hole, "last_event", path, nullable=True)
        if (first is None) != (last is None):
            raise TraceFormatError(f"{path}: first_event and last_event must be both null or not")
        if first is not None and last is not None:
            # The page nests each hole's events in one element: ranges in order, disjoint.
            if not previous_last < first <= last < n_events:
                raise TraceFormatError(
                    f"{path}: events {first}..{last} out of order, overlapping an earlier "
                    f"hole or past the {n_events} events")
            previous_last = last
        if "context" in hole:  # absent in traces written before branches existed
            _field(hole, "context", str, path, nullable=True)
        options = hole.get("options")
        if kind == "gen" and options is not None:
            raise TraceFormatError(f"{path}.options: must be null for a gen hole")
        _check_drawn(hole, kind, path)
        if kind == "select":
            for j, option in enumerate(_sequence(options, f"{path}.options")):
                opt_path = f"{path}.options[{j}]"
                opt = _mapping(option, opt_path)
                _field(opt, "text", str, opt_path)
                _logprob(opt, "logprob", opt_path)
                _probability(opt, "prob", opt_path)


def _check_drawn(hole: Mapping[str, object], kind: object, path: str) -> None:
    """A gen hole's `values`, `log_evidence` and `particles` (sampler="exact"/"smc"), when
    present: absent in traces of masked holes and of traces written before them."""
    for key, share in (("values", "prob"), ("particles", "weight")):
        if key not in hole:
            continue
        if kind != "gen":
            raise TraceFormatError(f"{path}.{key}: only a gen hole has {key}")
        for j, item in enumerate(_sequence(hole[key], f"{path}.{key}")):
            item_path = f"{path}.{key}[{j}]"
            entry = _mapping(item, item_path)
            _field(entry, "text", str, item_path)
            _probability(entry, share, item_path)
    if "log_evidence" in hole:
        _logprob(hole, "log_evidence", path, nullable=True)


def _check_options(events: Sequence[object], holes: Sequence[object]) -> None:
    """A select token's option indexes its hole's options (both already shape-checked)."""
    for i, obj in enumerate(events):
        event = cast(Mapping[str, object], obj)
        if event["kind"] != "select":
            continue
        hole = cast(Mapping[str, object], holes[cast(int, event["hole"])])
        options = hole["options"]
        if hole["kind"] != "select" or not isinstance(options, (list, tuple)):
            raise TraceFormatError(f"events[{i}].hole: a select token in a gen hole")
        if cast(int, event["option"]) >= len(options):
            raise TraceFormatError(f"events[{i}].option: not an index into holes"
                                   f"[{hole['index']}].options")


# Field checks. Each returns the value it checked, so callers can test relations.

def _mapping(obj: object, path: str) -> Mapping[str, object]:
    if not isinstance(obj, Mapping):
        raise TraceFormatError(f"{path}: expected an object, got {type(obj).__name__}")
    return cast(Mapping[str, object], obj)


def _sequence(obj: object, path: str) -> Sequence[object]:
    if not isinstance(obj, (list, tuple)):
        raise TraceFormatError(f"{path}: expected a list, got {type(obj).__name__}")
    return obj


def _field(obj: Mapping[str, object], key: str, kind: type, path: str,
           nullable: bool = False) -> object:
    if key not in obj:
        raise TraceFormatError(f"{path}.{key}: missing")
    value = obj[key]
    if value is None and nullable:
        return None
    # bool is an int subclass: a flag where a count is due (or the reverse) is a writer's bug.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = kind.__name__ + (" or null" if nullable else "")
        raise TraceFormatError(f"{path}.{key}: expected {expected}, got {value!r}")
    return value


def _choice(obj: Mapping[str, object], key: str, allowed: Sequence[str], path: str) -> str:
    value = obj.get(key)
    if value not in allowed:
        raise TraceFormatError(f"{path}.{key}: expected one of {list(allowed)}, got {value!r}")
    return cast(str, value)


def _index(obj: Mapping[str, object], key: str, path: str, nullable: bool = False) -> int | None:
    value = _field(obj, key, int, path, nullable)
    if value is not None and cast(int, value) < 0:
        raise TraceFormatError(f"{path}.{key}: negative")
    return cast("int | None", value)


def _number(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceFormatError(f"{path}: expected a number, got {value!r}")
    if not math.isfinite(value):
        raise TraceFormatError(f"{path}: {value} is not finite (write null instead)")
    return float(value)


def _logprob(obj: Mapping[str, object], key: str, path: str,
             nullable: bool = False) -> float | None:
    if key not in obj:
        raise TraceFormatError(f"{path}.{key}: missing")
    value = obj[key]
    if value is None and nullable:
        return None
    number = _number(value, f"{path}.{key}")
    if number > _LOGPROB_SLACK:
        raise TraceFormatError(f"{path}.{key}: a log-probability above 0 ({number})")
    return number


def _probability(obj: Mapping[str, object], key: str, path: str,
                 nullable: bool = False) -> float | None:
    if key not in obj:
        raise TraceFormatError(f"{path}.{key}: missing")
    value = obj[key]
    if value is None and nullable:
        return None
    number = _number(value, f"{path}.{key}")
    if not 0.0 <= number <= 1.0 + _LOGPROB_SLACK:
        raise TraceFormatError(f"{path}.{key}: {number} is not a probability")
    return number


def _json_value(value: object, path: str) -> None:
    """A captured value: JSON data all the way down, every float finite."""
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, (int, float)):
        _number(value, path)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _json_value(item, f"{path}[{i}]")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TraceFormatError(f"{path}: key {key!r} is not a string")
            _json_value(item, f"{path}.{key}")
    else:
        raise TraceFormatError(f"{path}: {type(value).__name__} is not JSON data")
