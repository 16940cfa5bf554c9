"""The four benchmark workloads (rpg, longdoc, batch, regex): each is a list of parts (fixed
text, inputs, holes, loops) that renders both to a qrun template and to the flat step list the
naive baseline executes, plus the input mappings it runs on. All deterministic."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qrun.constraint.patterns import PATTERNS

# --- parts -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Text:
    """Fixed text, inserted verbatim (must not contain template tag openers)."""

    text: str


@dataclass(frozen=True, slots=True)
class Var:
    """An input interpolated as fixed text (`{{ name }}`)."""

    name: str


@dataclass(frozen=True, slots=True)
class Gen:
    """A `gen` hole. `regex` is a stdlib pattern name (DATE, EMAIL...) or a regex."""

    name: str
    stop: tuple[str, ...] = ()
    max_tokens: int = 128
    regex: str | None = None

    @property
    def pattern(self) -> str | None:
        """The regex itself (a stdlib name resolved)."""
        if self.regex is None:
            return None
        return PATTERNS.get(self.regex, self.regex)


@dataclass(frozen=True, slots=True)
class Select:
    """A `select` hole over fixed options."""

    name: str
    options: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Loop:
    """`count` iterations of `body`, with `sep` between iterations (not after the last);
    holes inside capture lists."""

    count: int
    body: tuple[Part, ...]
    sep: str = ""


Part = Text | Var | Gen | Select | Loop
Step = Text | Gen | Select  # what the naive baseline executes, loops and inputs expanded


@dataclass(frozen=True)
class Workload:
    """A template (as parts) and the inputs it runs on. `warmup_inputs` is how many of them
    the warm-up run uses (the batch workload warms up on one of its 16)."""

    name: str
    description: str
    parts: tuple[Part, ...]
    inputs: tuple[Mapping[str, Any], ...] = ({},)
    warmup_inputs: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def template(self) -> str:
        """The qrun template text."""
        return _render_seq(self.parts)

    def steps(self, inputs: Mapping[str, Any]) -> list[Step]:
        """The flat step list for one input mapping: inputs substituted, loops unrolled,
        neighbouring texts merged. Loop holes are named `name[k]`."""
        out: list[Step] = []
        for step in _expand(self.parts, inputs, None):
            if isinstance(step, Text) and out and isinstance(out[-1], Text):
                out[-1] = Text(out[-1].text + step.text)
            elif not (isinstance(step, Text) and not step.text):
                out.append(step)
        return out

    def render(self, inputs: Mapping[str, Any], values: Mapping[str, Any]) -> str:
        """The text a run with these hole values produces (to check that the template and
        the naive step list agree)."""
        pieces = []
        for step in self.steps(inputs):
            if isinstance(step, Text):
                pieces.append(step.text)
            else:
                pieces.append(str(lookup(values, step.name)))
        return "".join(pieces)


def lookup(values: Mapping[str, Any], name: str) -> Any:
    """values["x"] for "x", values["x"][k] for "x[k]" (a hole inside a loop)."""
    if name.endswith("]"):
        base, _, index = name[:-1].partition("[")
        return values[base][int(index)]
    return values[name]


def _literal(value: Any) -> str:
    # Template string literals take Python escapes; JSON's are a subset of them.
    return json.dumps(value)


# qrun trims the first newline right after a block tag (Jinja's trim_blocks); an empty
# interpolation between the tag and fixed text that starts with one keeps that newline.
_KEEP_NEWLINE = '{{ "" }}'


def _starts_line(part: Part | None) -> bool:
    return isinstance(part, Text) and part.text.startswith(("\n", "\r\n"))


def _render_seq(parts: Sequence[Part]) -> str:
    out = []
    for i, part in enumerate(parts):
        out.append(_render(part))
        if isinstance(part, Loop) and _starts_line(parts[i + 1] if i + 1 < len(parts) else None):
            out.append(_KEEP_NEWLINE)
    return "".join(out)


def _render(part: Part) -> str:
    match part:
        case Text():
            for opener in ("{{", "{%", "{#"):
                assert opener not in part.text, f"fixed text contains {opener!r}"
            return part.text
        case Var():
            return "{{ " + part.name + " }}"
        case Gen():
            args = [f"gen {part.name}"]
            if part.regex is not None:
                args.append("regex=" + (part.regex if part.regex in PATTERNS
                                        else _literal(part.regex)))
            if part.stop:
                stop = part.stop[0] if len(part.stop) == 1 else list(part.stop)
                args.append("stop=" + _literal(stop))
            args.append(f"max_tokens={part.max_tokens}")
            return "{{ " + " ".join(args) + " }}"
        case Select():
            return "{{ select " + part.name + " options=" + _literal(list(part.options)) + " }}"
        case Loop():
            guard = _KEEP_NEWLINE if part.body and _starts_line(part.body[0]) else ""
            body = _render_seq(part.body)
            sep = ("{{ " + _literal(part.sep) + " if not loop.last else \"\" }}"
                   if part.sep else "")
            return f"{{% for i in range({part.count}) %}}{guard}{body}{sep}{{% endfor %}}"


def _expand(parts: Sequence[Part], inputs: Mapping[str, Any], k: int | None) -> Iterator[Step]:
    for part in parts:
        match part:
            case Text():
                yield part
            case Var():
                yield Text(str(inputs[part.name]))
            case Gen():
                name = part.name if k is None else f"{part.name}[{k}]"
                yield Gen(name, part.stop, part.max_tokens, part.regex)
            case Select():
                name = part.name if k is None else f"{part.name}[{k}]"
                yield Select(name, part.options)
            case Loop():
                for i in range(part.count):
                    yield from _expand(part.body, inputs, i)
                    if i < part.count - 1:
                        yield Text(part.sep)


# --- rpg -----------------------------------------------------------------------------------
# guidance's README "character maker", in qrun's language: a JSON profile with 12 holes.

_Q = ('"',)
RPG = Workload(
    name="rpg",
    description="character-profile JSON, 12 holes: regex id/age/strength, quoted strings "
                "stopped at '\"', select armor and weapon, 3 list items",
    parts=(
        Text("The following is a character profile for a fantasy role-playing game, in JSON "
             "format.\n```json\n{\n    \"id\": "),
        Gen("id", regex=r"[0-9]{1,4}", max_tokens=4),
        Text(",\n    \"description\": \""),
        Gen("description", stop=_Q, max_tokens=32),
        Text("\",\n    \"name\": \""),
        Gen("name", stop=_Q, max_tokens=10),
        Text("\",\n    \"age\": "),
        Gen("age", regex=r"[0-9]{1,3}", max_tokens=3),
        Text(",\n    \"armor\": \""),
        Select("armor", ("leather", "chainmail", "plate")),
        Text("\",\n    \"weapon\": \""),
        Select("weapon", ("sword", "axe", "mace", "spear", "bow", "crossbow")),
        Text("\",\n    \"class\": \""),
        Gen("class", stop=_Q, max_tokens=8),
        Text("\",\n    \"mantra\": \""),
        Gen("mantra", stop=_Q, max_tokens=24),
        Text("\",\n    \"strength\": "),
        Gen("strength", regex=r"[0-9]{1,2}", max_tokens=2),
        Text(",\n    \"items\": ["),
        Loop(3, (Text("\n        \""), Gen("item", stop=_Q, max_tokens=8), Text("\"")), sep=","),
        Text("\n    ]\n}\n```\n"),
    ),
)

# --- longdoc -------------------------------------------------------------------------------
# A ~1,500-token report on an invented town, built from fixed sentence templates with a fixed
# seed, with five facts placed at fixed points; then 5 question/answer pairs.

_FACTS = (
    "The lighthouse at Karsk Point was completed in 1887 and still guides the fishing fleet "
    "home.",
    "The first mayor of Maren Cove was Elise Thornbury, a former schoolteacher.",
    "The river that runs through the middle of the town is called the Aldwater.",
    "The herring festival is held every year in the second week of June.",
    "At the census of 2011 the town had a population of 14,200.",
)
_QUESTIONS = (
    "In what year was the lighthouse at Karsk Point completed?",
    "Who was the first mayor of Maren Cove?",
    "What is the name of the river that runs through the town?",
    "When is the herring festival held?",
    "What was the population of the town at the census of 2011?",
)
_YEARS = [str(y) for y in range(1802, 1999, 7)]
_PEOPLE = ["Anna Vries", "Jonas Hale", "Marta Quill", "Peter Osk", "Ruth Danner", "Simon Brae",
           "Clara Wend", "Hugo Marsh", "Ida Lund", "Oskar Feld"]
_PLACES = ["the harbour", "the old market", "the chapel on the hill", "the north quay",
           "the salt warehouses", "the ropewalk", "the grammar school", "the railway station",
           "the town hall", "the fish auction hall"]
_GROUPS = ["the town council", "the harbour board", "the fishermen's guild", "the parish",
           "the merchants' association", "the historical society"]
_THINGS = ["a stone breakwater", "a covered market", "a public library", "a lifeboat station",
           "a new school", "a cannery", "a tramway", "a museum of local history"]
_SENTENCES = (
    "In {year}, {group} approved plans for {thing} near {place}.",
    "Local records show that {person} was responsible for the work at {place} in {year}.",
    "The winter of {year} was remembered for storms that damaged {place} and delayed "
    "the opening of {thing}.",
    "{person} wrote in a letter that {group} had argued for months about the cost of {thing}.",
    "By {year} the area around {place} had become the busiest part of the town.",
    "Visitors often remark that {place} looks much as it did when {person} painted it in "
    "{year}.",
    "A fire in {year} destroyed part of {place}, and {group} raised money to rebuild it.",
    "Minutes kept by {group} mention {thing} for the first time in {year}.",
    "The building of {thing} brought steady work to families living near {place}.",
    "{person} later recalled that the opening of {thing} drew crowds from the whole coast.",
    "Photographs from {year} show {place} crowded with carts, barrels and fishing nets.",
    "In the years after {year}, {group} spent most of its budget on repairs to {place}.",
)


def _document(paragraphs: int = 10, per_paragraph: int = 6, seed: int = 20240611) -> str:
    rng = random.Random(seed)
    out = []
    for p in range(paragraphs):
        sentences = []
        for _ in range(per_paragraph):
            template = rng.choice(_SENTENCES)
            sentence = template.format(
                year=rng.choice(_YEARS), person=rng.choice(_PEOPLE), place=rng.choice(_PLACES),
                group=rng.choice(_GROUPS), thing=rng.choice(_THINGS))
            sentences.append(sentence[0].upper() + sentence[1:])
        if p % 2 == 1 and p // 2 < len(_FACTS):
            sentences.insert(rng.randrange(len(sentences) + 1), _FACTS[p // 2])
        out.append(" ".join(sentences))
    return "\n\n".join(out)


def _longdoc_parts() -> tuple[Part, ...]:
    parts: list[Part] = [
        Text("Read the report below, then answer each question in a few words.\n\n"
             "REPORT: A short history of Maren Cove\n\n"),
        Var("document"),
        Text("\n\nQUESTIONS AND ANSWERS\n"),
    ]
    for i, question in enumerate(_QUESTIONS, 1):
        parts += [Text(f"\nQuestion: {question}\nAnswer:"),
                  Gen(f"answer{i}", stop=("\n",), max_tokens=16)]
    parts.append(Text("\n"))
    return tuple(parts)


LONGDOC = Workload(
    name="longdoc",
    description="a ~1,500-token document, then 5 question/answer pairs "
                "(each answer a hole, stop \"\\n\", max_tokens 16)",
    parts=_longdoc_parts(),
    inputs=({"document": _document()},),
)

# --- batch ---------------------------------------------------------------------------------

_SHOTS = (
    ("What is the capital of France?", "Paris"),
    ("How many legs does a spider have?", "Eight"),
    ("Who wrote Romeo and Juliet?", "William Shakespeare"),
    ("What is the largest planet in the solar system?", "Jupiter"),
    ("What is the chemical symbol for gold?", "Au"),
    ("In which country are the pyramids of Giza?", "Egypt"),
    ("What is the boiling point of water in Celsius?", "100 degrees"),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci"),
    ("What is the longest river in South America?", "The Amazon"),
    ("How many days are there in a leap year?", "366"),
    ("What is the capital of Japan?", "Tokyo"),
    ("Which ocean lies between Europe and North America?", "The Atlantic Ocean"),
    ("Who was the first person to walk on the Moon?", "Neil Armstrong"),
    ("What is the smallest prime number?", "2"),
    ("How many continents are there?", "Seven"),
    ("What is the capital of Australia?", "Canberra"),
)
_BATCH_QUESTIONS = (
    "What is the capital of Italy?",
    "How many sides does a hexagon have?",
    "Who discovered penicillin?",
    "What is the largest ocean on Earth?",
    "What is the chemical symbol for iron?",
    "Which planet is known as the Red Planet?",
    "Who wrote Pride and Prejudice?",
    "What is the tallest mountain in the world?",
    "How many minutes are there in an hour?",
    "What is the capital of Canada?",
    "Which metal is liquid at room temperature?",
    "What is the square root of 81?",
    "Who developed the theory of relativity?",
    "What is the largest desert in the world?",
    "Which country gave the Statue of Liberty to the United States?",
    "What is the main ingredient of guacamole?",
)


def _batch_parts() -> tuple[Part, ...]:
    shots = "".join(f"Q: {q}\nA: {a}\n\n" for q, a in _SHOTS)
    return (
        Text("Answer each trivia question with a short answer.\n\n" + shots + "Q: "),
        Var("question"),
        Text("\nA:"),
        Gen("answer", stop=("\n",), max_tokens=12),
        Text("\n"),
    )


BATCH = Workload(
    name="batch",
    description="a ~300-token few-shot prefix, then one question and one hole (max_tokens 12, "
                "stop \"\\n\"), over 16 inputs run one after another with Query.run_many",
    parts=_batch_parts(),
    inputs=tuple({"question": q} for q in _BATCH_QUESTIONS),
    warmup_inputs=1,
)

# --- regex ---------------------------------------------------------------------------------

_PEOPLE_RECORDS = (
    ("Alice Moreno", "a logistics planner from Denver"),
    ("Bram de Wit", "a software tester based in Chicago"),
    ("Carmen Ruiz", "a nurse who moved to Seattle"),
    ("Daniel Okafor", "a civil engineer in Atlanta"),
    ("Erin Walsh", "a teacher living in Boston"),
)


def _regex_parts() -> tuple[Part, ...]:
    parts: list[Part] = [Text("Customer records, one field per line (dates as YYYY-MM-DD, "
                              "US phone numbers).\n")]
    for n, (name, who) in enumerate(_PEOPLE_RECORDS, 1):
        parts += [
            Text(f"\nRecord {n}: {name}, {who}.\nDate of birth: "),
            Gen(f"birth{n}", regex="DATE", max_tokens=12),
            Text("\nEmail: "),
            Gen(f"email{n}", regex="EMAIL", max_tokens=16),
            Text("\nPhone: "),
            Gen(f"phone{n}", regex="PHONE_US", max_tokens=16),
            Text("\nOrders placed: "),
            Gen(f"orders{n}", regex="INT", max_tokens=4),
            Text("\n"),
        ]
    return tuple(parts)


REGEX = Workload(
    name="regex",
    description="20 regex holes (DATE, EMAIL, PHONE_US, INT), each after a short label line",
    parts=_regex_parts(),
)

WORKLOADS: dict[str, Workload] = {w.name: w for w in (RPG, LONGDOC, BATCH, REGEX)}
