"""What token healing does to greedy outputs (issue #38): every example template's cases, the
bench workloads and programs ported from other systems' published examples, each run greedily
with healing (the default) and with it off, in one run:

    python -m bench.healing [--backend transformers|llamacpp]

For each run whose text differs, both texts are judged from where the two part, in the
tokenizer's own tokens of the whole rendered text:

- `repeated`: the share of those tokens that close a 3-gram of tokens already seen since the
  parting point (`1. 2. 2. Practice`, ` https: https: https:`, `12345678901234567890`);
- `per_byte`: the model's log-probability of that text per byte of it (LM evaluations'
  bits-per-byte normalisation).

Per byte, not per token: the mean per token (`per_token`, printed too) depends on how the text
is cut into tokens, which is what healing changes, and it favours text the model finds easy
token by token: digit after digit, a phrase repeated. The first version of this bench judged
by it and called healing worse in 5 of 13 changed runs where each time the unhealed text was
the degenerate one (`2018-01-` against `Paris`). So healing is judged worse where its text
repeats itself more (by more than REPEATED_MARGIN), or, as repetitive, has a lower
log-probability per byte; better the other way round. One JSON object per line: one per
changed run, then a summary."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any
from unittest import mock

import numpy as np

import qrun
from bench.forward_cost import greedy_runs
from qrun.backends import Backend
from qrun.runtime.sampler import log_softmax

# Programs from other systems' published examples, ported (the text before each hole is what
# healing looks at: a trailing space, a word, a colon).
PORTED = {
    # guidance README: gen after a prompt
    "guidance:capital": "The capital of France is {{ gen a max_tokens=8 }}",
    "guidance:joke": "Tell me a joke about cats:{{ gen joke stop='\\n' max_tokens=24 }}",
    "guidance:character": ('The following is a character profile for an RPG game in JSON '
                           'format.\n```json\n{\n    "id": "{{ gen id regex=INT }}",\n'
                           '    "description": "{{ gen desc stop=\'"\' max_tokens=24 }}",\n'
                           '    "name": "{{ gen name stop=\'"\' max_tokens=8 }}",\n'
                           '    "age": {{ gen age regex=INT }},\n}'),
    # LMQL docs: a question and an answer
    "lmql:qa": ("Q: What is the capital of Italy?\nA: The answer is{{ gen a stop='\\n' "
                "max_tokens=12 }}"),
    "lmql:joke": ('A great good dad joke. A indicates the punchline\nQ:{{ gen joke stop="A:" '
                  'max_tokens=24 }}A:{{ gen punch stop="\\n" max_tokens=24 }}'),
    "lmql:math": ("Q: It was Sept. 1st, 2021 a week ago. What is the date 10 days ago in "
                  "MM/DD/YYYY?\nAnswer Choices: (A) 08/29/2021 (B) 08/28/2021\nA: Let's "
                  "think step by step.{{ gen steps stop='\\n' max_tokens=32 }}\nSo the answer "
                  "is{{ gen answer max_tokens=8 }}"),
    # SGLang README: multi-turn and tips
    "sglang:tips": ("Here are two tips for staying healthy: 1. Balanced Diet. 2. Regular "
                    "Exercise.\n\nTip 1: A balanced diet means{{ gen t1 stop='\\n' "
                    "max_tokens=24 }}\nTip 2: Regular exercise is{{ gen t2 stop='\\n' "
                    "max_tokens=24 }}"),
    "sglang:city": ("The city of Paris is famous for{{ gen fact stop='.' max_tokens=24 }}. "
                    "Its population is about{{ gen pop max_tokens=8 }}"),
    # Outlines README: a regex after a colon, a URL
    "outlines:ip": ('The IP address of a Google DNS server is '
                    '{{ gen ip regex="((25[0-5]|2[0-4][0-9]|1?[0-9]{1,2})\\.){3}'
                    '(25[0-5]|2[0-4][0-9]|1?[0-9]{1,2})" }}'),
    "outlines:url": "The project's home page is at https:{{ gen url max_tokens=12 }}",
    "prose:expression": "The math expression is{{ gen e max_tokens=12 }}",
    "prose:partial": "The largest planet in our solar sys{{ gen rest max_tokens=8 }}",
}


def runs(ported_only: bool = False
         ) -> Iterator[tuple[str, qrun.Query, dict[str, Any], dict[str, Any]]]:
    if not ported_only:
        yield from greedy_runs()
    for name, text in PORTED.items():
        yield f"ported:{name}", qrun.Query(text), {}, {}


REPEATED_MARGIN = 0.1
"""How much more of one text must repeat itself for it to count as the worse one."""


@dataclass(frozen=True)
class Judgement:
    per_token: float  # mean log-probability per token of the rest (for comparison only)
    per_byte: float  # log-probability of the rest per byte of it
    repeated: float  # the share of its tokens that close a 3-gram seen before in it


def judge(model: Backend, text: str, start: int) -> Judgement:
    """`text` from character `start` on, as the model reads the whole text in its own tokens."""
    ids = [model.start_token_id, *model.encode(text)]
    before = len(model.encode(text[:start])) + 1 if start else 1
    logprobs = log_softmax(model.forward(ids, model.new_cache(), len(ids)).astype(np.float64))
    picked = [float(logprobs[k - 1][ids[k]]) for k in range(before, len(ids))]
    rest = ids[before:]
    seen: set[tuple[int, ...]] = set()
    closing = 0
    for k in range(2, len(rest)):
        gram = tuple(rest[k - 2:k + 1])
        closing += gram in seen
        seen.add(gram)
    return Judgement(per_token=float(np.mean(picked)) if picked else 0.0,
                     per_byte=sum(picked) / max(1, len(model.decode(rest).encode())),
                     repeated=closing / len(rest) if rest else 0.0)


def verdict(healed: Judgement, plain: Judgement) -> str:
    """"worse", "better" or "even" for the healed text against the unhealed one."""
    if abs(healed.repeated - plain.repeated) > REPEATED_MARGIN:
        return "worse" if healed.repeated > plain.repeated else "better"
    if healed.per_byte == plain.per_byte:
        return "even"
    return "worse" if healed.per_byte < plain.per_byte else "better"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="transformers")
    parser.add_argument("--ported-only", action="store_true",
                        help="only the programs ported from other systems")
    args = parser.parse_args()
    model = qrun.load_model("smollm2", backend=args.backend, cache_mb=0)
    total = changed = per_token_lower = 0
    verdicts = {"worse": 0, "better": 0, "even": 0}
    for name, query, inputs, fill in runs(args.ported_only):
        total += 1
        healed = query.run(inputs, model=model, temperature=0, fill=fill or None)
        # Healing off: the policy's answer is "take nothing back" (runtime/healing.py).
        with mock.patch("qrun.runtime.executor.healable_tail", return_value=0):
            plain = query.run(inputs, model=model, temperature=0, fill=fill or None)
        if healed.text == plain.text:
            continue
        changed += 1
        # Scored from where the two texts part (the same text before it).
        cut = next((k for k, (a, b) in enumerate(zip(healed.text, plain.text, strict=False))
                    if a != b), min(len(healed.text), len(plain.text)))
        judged = {"healed": judge(model, healed.text, cut),
                  "not_healed": judge(model, plain.text, cut)}
        per_token_lower += judged["healed"].per_token < judged["not_healed"].per_token
        said = verdict(judged["healed"], judged["not_healed"])
        verdicts[said] += 1
        print(json.dumps({"run": name, "healed": healed.text[cut:][:80],
                          "not_healed": plain.text[cut:][:80], "healing": said,
                          "scores": {side: {k: round(v, 3) for k, v in asdict(j).items()}
                                     for side, j in judged.items()}}), flush=True)
    print(json.dumps({"backend": args.backend, "runs": total, "changed": changed,
                      "healing": verdicts, "per_token_lower_with_healing": per_token_lower}),
          flush=True)


if __name__ == "__main__":
    main()
