"""The threads where llguidance builds grammars (qrun/constraint/grammar/build_thread.py):
compiles run there and nowhere else (those a cache keeps in a thread of their own), values
and exceptions come back to the caller, a build that builds runs in place, and a forked
child gets threads of its own."""

from __future__ import annotations

import multiprocessing
import threading
import weakref
from types import SimpleNamespace
from typing import Any

import llguidance
import pytest

from qrun.constraint.grammar import check_lark, json_grammar
from qrun.constraint.grammar.build_thread import built
from qrun.constraint.grammar_index import LlgCache
from qrun.constraint.vocab import Vocabulary
from qrun.matcher import Matcher
from tests.hang import alarm, wait_until


def _thread_name() -> str:
    return threading.current_thread().name


def test_a_build_runs_in_the_build_thread_and_returns_its_value() -> None:
    name = built(_thread_name)
    assert name != threading.current_thread().name
    assert built(_thread_name) == name  # one long-lived thread


def test_an_exception_comes_back_to_the_caller() -> None:
    def fails() -> None:
        raise KeyError("from the build")

    with pytest.raises(KeyError, match="from the build"):
        built(fails)
    assert built(lambda: 7) == 7  # the thread lives on


def test_a_build_inside_a_build_runs_in_place() -> None:
    with alarm(20):  # waiting on itself would hang
        assert built(lambda: built(_thread_name)) == built(_thread_name)
        assert built(lambda: built(_thread_name), kept=True) == built(_thread_name, kept=True)
        assert built(lambda: built(_thread_name, kept=True)) == built(_thread_name)


def test_kept_builds_run_in_a_long_lived_thread_of_their_own() -> None:
    name = built(_thread_name, kept=True)
    assert name not in (built(_thread_name), threading.current_thread().name)
    assert built(_thread_name, kept=True) == name


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads llguidance compiles in (grammars and validations), as they
    come."""
    seen: list[str] = []
    real_matcher = llguidance.LLMatcher

    class Recording:  # what grammar_index.py and grammar/text.py call of llguidance.LLMatcher
        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            seen.append(_thread_name())
            return real_matcher(*args, **kwargs)

        @staticmethod
        def validate_grammar_with_warnings(*args: Any, **kwargs: Any) -> Any:
            seen.append(_thread_name())
            return real_matcher.validate_grammar_with_warnings(*args, **kwargs)

    monkeypatch.setattr(llguidance, "LLMatcher", Recording)
    return seen


def test_every_llguidance_compile_runs_there(compiles: list[str],
                                             smol_vocab: Vocabulary) -> None:
    schema = {"type": "object", "properties": {"build_thread": {"type": "integer"}},
              "required": ["build_thread"]}  # a schema no other test compiles
    matcher = Matcher(SimpleNamespace(vocabulary=smol_vocab), json=schema)
    assert matcher.consume_text('{"build_thread": 5}') and matcher.accepting()
    assert check_lark('start: "a"+') is None
    assert len(compiles) == 2 and set(compiles) == {built(_thread_name)}


def test_a_grammar_a_cache_keeps_builds_in_the_kept_thread(compiles: list[str],
                                                           smol_vocab: Vocabulary) -> None:
    grammar = json_grammar({"type": "array", "items": {"const": "build_thread"}})
    cache = LlgCache()
    gone = weakref.ref(cache.get(grammar, smol_vocab))  # asked for once: not kept
    with alarm(10):  # the build thread lets go of what it built just after returning it
        wait_until(lambda: gone() is None)
    kept = cache.get(grammar, smol_vocab)  # asked for again: built to keep
    assert cache.get(grammar, smol_vocab) is kept
    assert compiles == [built(_thread_name), built(_thread_name, kept=True)]


def _child(queue: Any) -> None:
    queue.put((built(_thread_name), built(_thread_name, kept=True)))


def test_a_forked_child_gets_its_own_thread() -> None:
    parent = built(_thread_name), built(_thread_name, kept=True)  # both exist before the fork
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child, args=(queue,))
    child.start()
    with alarm(60):
        names = queue.get()
        child.join()
    assert child.exitcode == 0 and names == parent  # named alike, started in the child
