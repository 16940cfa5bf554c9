"""Host functions for examples/agent.tmpl, a ReAct agent with two tools: `qrun
examples/agent.tmpl --functions examples/agent.py -v question="..."`. The template offers them
to the model as tools (the `tools()` builtin reads their signatures and docstrings) and runs
the call the model writes with `run_tool`."""

from __future__ import annotations

import runpy
from pathlib import Path

import qrun

# The calculator of examples/calculator.py: ast-read arithmetic, never evaluating code.
_calc = runpy.run_path(str(Path(__file__).with_name("calculator.py")))["calc"]

# A small encyclopedia: what `lookup` knows (a real agent would search an index).
FACTS = {
    "eiffel tower": "The Eiffel Tower is 330 metres tall and was finished in 1889.",
    "mount everest": "Mount Everest is 8849 metres high.",
    "moon": "The Moon is on average 384400 km from the Earth.",
    "paris": "Paris is the capital of France; about 2.1 million people live there.",
    "python": "Python is a programming language first released in 1991.",
}

functions = qrun.Functions()


@functions.register
def calculate(expression: str) -> float | int:
    """Compute an arithmetic expression: numbers, + - * / ** and parentheses."""
    return _calc(expression)  # type: ignore[no-any-return]


@functions.register
def lookup(topic: str) -> str:
    """Look a topic up in the encyclopedia (a place, a landmark, a thing)."""
    key = topic.strip().lower()
    for name, fact in FACTS.items():
        if name in key or key in name:
            return fact
    return f"Nothing is known about {topic!r}. Known topics: {', '.join(sorted(FACTS))}."
