"""What token healing does to greedy outputs (issue #38): every example template's cases, the
bench workloads and programs ported from other systems' published examples, each run greedily
with healing (the default) and with it off, in one run:

    python -m bench.healing [--backend transformers|llamacpp]

For each run whose text differs, both texts are scored by the model itself: the mean
log-probability per token of the text from where the two part, under the tokenizer's own
tokens of the whole rendered text. Healing is worse where that mean is lower
than without it. One JSON object per line: one per changed run, then a summary."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
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


def mean_logprob(model: Backend, text: str, start: int) -> float:
    """Mean log-probability per token of `text` from character `start` on, as the model reads
    the whole text in its own tokens."""
    ids = [model.start_token_id, *model.encode(text)]
    before = len(model.encode(text[:start])) + 1 if start else 1
    logprobs = log_softmax(model.forward(ids, model.new_cache(), len(ids)).astype(np.float64))
    picked = [float(logprobs[k - 1][ids[k]]) for k in range(before, len(ids))]
    return float(np.mean(picked)) if picked else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="transformers")
    parser.add_argument("--ported-only", action="store_true",
                        help="only the programs ported from other systems")
    args = parser.parse_args()
    model = qrun.load_model("smollm2", backend=args.backend, cache_mb=0)
    total = changed = worse = 0
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
        score = [round(mean_logprob(model, r.text, cut), 3) for r in (healed, plain)]
        worse += score[0] < score[1]
        print(json.dumps({"run": name, "healed": healed.text[cut:][:80],
                          "not_healed": plain.text[cut:][:80],
                          "mean_logprob": {"healed": score[0], "not_healed": score[1]}}),
              flush=True)
    print(json.dumps({"backend": args.backend, "runs": total, "changed": changed,
                      "healing_worse": worse}), flush=True)


if __name__ == "__main__":
    main()
