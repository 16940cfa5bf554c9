"""The llamacpp backend (tests marked `llamacpp`; `make test` builds llama-cpp-python with
`make llamacpp` and runs them in a pytest process of their own): the shipped GGUF as is, its
tokenizer against the transformers backend's, the example templates with every constraint
holding, and the KV cache (segments, rollback, forks, prefix cache, batches, token trees)
against cold evaluations of the same ids.

llama.cpp runs the 4-bit weights with 8-bit activations, and its results depend slightly on
how tokens were batched and where their cells sit (docs/language.md §18, §19), so logits are
compared with a tolerance that a wrong context exceeds many times over, never bitwise.

Without llama_cpp installed these tests skip, unless QRUN_REQUIRE_LLAMACPP=1 (then they
fail: the tier of `make test` must not pass by skipping)."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from test_examples import (
    CONSTRAINED,
    ENDINGS,
    EXAMPLES,
    INPUTS,
    check_constrained,
    check_endings,
    check_reproductions,
    check_seams,
    check_values,
    functions_of,
)
from tiers import require_llama_cpp

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import GenerationError, ModelLoadError
from qrun.runtime.sampler import log_softmax

pytestmark = pytest.mark.llamacpp

require_llama_cpp()

from qrun.backends.llamacpp import LlamaCache, LlamaCppBackend  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
# Largest |Δ log-probability| over the reference's 20 most likely tokens between two ways of
# computing the same context (measured here: 0-0.25; a context with one sentence left out: 1.3-4.5).
TOLERANCE = 0.35


def ids_of(backend: LlamaCppBackend, text: str) -> list[int]:
    return backend.encode(text)


def gap(reference: npt.NDArray[np.float32], other: npt.NDArray[np.float32]) -> float:
    """Largest |Δ log-probability| over the reference's top 20 tokens ([V] rows)."""
    a, b = log_softmax(reference), log_softmax(other)
    top = np.argsort(-a)[:20]
    return float(np.abs(a[top] - b[top]).max())


def cold(backend: LlamaCppBackend, ids: list[int], logits_for: int = 1
         ) -> npt.NDArray[np.float32]:
    return backend.forward(ids, backend.new_cache(), logits_for)


TEXT_A = "The river town of Emberwick was founded by fishermen in 1412."
TEXT_B = " Its bridge is made of red stone, and its market opens at dawn."
TEXT_C = " Today the town is known for"


# --- the tokenizer ----------------------------------------------------------------------


def tokenizer_texts() -> list[str]:
    texts = [p.read_text() for p in sorted(EXAMPLES.glob("*.tmpl"))]
    texts.append((ROOT / "README.md").read_text())
    texts += ["a\n\n1", "1\n\n2", "a  1", "x \n1", "a\t\t1", "12345 67.89", "café ☕ 日本",
              "a<|im_end|>b<|im_start|>", "  leading\n\n\ntrailing  "]
    return texts


def test_tokenization_equals_the_transformers_backend(
        llama: LlamaCppBackend, smollm2: TransformersBackend) -> None:
    for text in tokenizer_texts():
        for special in (False, True):
            assert llama.encode(text, special=special) == smollm2.encode(text, special=special)
    ids = smollm2.encode("a<|im_end|>b café", special=True)
    assert llama.decode(ids) == smollm2.decode(ids) == "ab café"


def test_vocabulary_and_special_tokens_equal_the_transformers_backend(
        llama: LlamaCppBackend, smollm2: TransformersBackend) -> None:
    assert llama.vocabulary.token_bytes == smollm2.vocabulary.token_bytes
    assert llama.eos_token_ids == smollm2.eos_token_ids
    assert llama.start_token_id == smollm2.start_token_id
    assert llama.vocab_size == smollm2.vocab_size
    for role in ("system", "user", "assistant"):
        assert llama.chat_markers(role) == smollm2.chat_markers(role)


# --- the KV cache -------------------------------------------------------------------------


def test_segments_fed_into_one_cache_equal_a_cold_evaluation(llama: LlamaCppBackend) -> None:
    a, b, c = (ids_of(llama, t) for t in (TEXT_A, TEXT_B, TEXT_C))
    cache = llama.new_cache()
    llama.forward(a, cache)
    llama.forward(b, cache)
    warm = llama.forward(c, cache, logits_for=2)
    assert cache.length() == len(a + b + c)
    whole = cold(llama, a + b + c, logits_for=2)
    assert warm.shape == whole.shape == (2, llama.vocab_size)
    for row in range(2):
        assert gap(whole[row], warm[row]) < TOLERANCE
    # The tolerance tells contexts apart: without A the next token is another distribution.
    assert gap(whole[1], cold(llama, b + c)[0]) > 3 * TOLERANCE


def test_rollback_then_feeding_again_equals_a_fresh_cache(llama: LlamaCppBackend) -> None:
    a, b, c = (ids_of(llama, t) for t in (TEXT_A, TEXT_B, TEXT_C))
    cache = llama.new_cache()
    llama.forward(a + b, cache)
    cache.crop(len(a))
    assert cache.length() == len(a)
    after = llama.forward(c, cache)[0]
    fresh = llama.new_cache()
    llama.forward(a, fresh)
    assert gap(llama.forward(c, fresh)[0], after) < TOLERANCE
    assert gap(cold(llama, a + b + c)[0], after) > 3 * TOLERANCE


def test_a_fork_is_independent_of_its_source(llama: LlamaCppBackend) -> None:
    a, b, c = (ids_of(llama, t) for t in (TEXT_A, TEXT_B, TEXT_C))
    cache = llama.new_cache()
    llama.forward(a, cache)
    fork = cache.fork()
    assert isinstance(fork, LlamaCache) and fork.seq != cache.seq
    llama.forward(b, fork)  # the fork grows, then the source is cropped: neither sees it
    cache.crop(len(a) - 3)
    llama.forward(a[-3:], cache)
    on_source = llama.forward(c, cache)[0]
    on_fork = llama.forward(c, fork)[0]
    assert gap(cold(llama, a + c)[0], on_source) < TOLERANCE
    assert gap(cold(llama, a + b + c)[0], on_fork) < TOLERANCE


def test_dead_caches_give_their_sequences_back(llama: LlamaCppBackend) -> None:
    before = llama.free_sequences()
    caches = [llama.new_cache() for _ in range(20)]
    for cache in caches:
        llama.forward([42, 43], cache)
    assert llama.free_sequences() == before - 20
    del caches, cache
    assert llama.free_sequences() == before


def test_batched_forward_equals_forwards_one_at_a_time(llama: LlamaCppBackend) -> None:
    texts = [TEXT_A, TEXT_B, TEXT_C, TEXT_A + TEXT_C]
    caches = [llama.new_cache() for _ in texts]
    for cache, text in zip(caches, texts, strict=True):
        llama.forward(ids_of(llama, text[:20]), cache)
    items = [(ids_of(llama, text[20:]), cache) for text, cache in zip(texts, caches, strict=True)]
    batched = llama.forward_batch(items, logits_for=2)
    for text, rows, (ids, cache) in zip(texts, batched, items, strict=True):
        assert rows.shape == (2, llama.vocab_size)
        assert cache.length() == len(ids_of(llama, text[:20])) + len(ids)
        one = cold(llama, ids_of(llama, text[:20]) + ids, logits_for=2)
        assert gap(one[1], rows[1]) < TOLERANCE


def test_a_rows_logits_do_not_depend_on_the_rows_beside_it(llama: LlamaCppBackend) -> None:
    # The shipped Q4_1 weights go through qrun's tiled kernel (scripts/patches/
    # llamacpp-q4_1-sgemm.patch) in every forward: each element is summed in the same order
    # whatever the tile, so a row's logits are the same bits alone or in a batch of any size
    # (odd sizes leave partial tiles); batched runs and speculation rely on it.
    contexts = [ids_of(llama, f"Fact {k}: the town of Emberwick has {k + 2} bridges and")
                for k in range(7)]
    alone = []
    for context in contexts:
        cache = llama.new_cache()
        llama.forward(context[:-1], cache)
        alone.append(llama.forward(context[-1:], cache))
    for n in (2, 3, 5, 7):
        caches = [llama.new_cache() for _ in range(n)]
        for cache, context in zip(caches, contexts, strict=False):
            llama.forward(context[:-1], cache)
        rows = llama.forward_batch([(context[-1:], cache) for context, cache
                                    in zip(contexts, caches, strict=False)])
        for k in range(n):
            assert np.array_equal(rows[k][-1], alone[k][-1]), (n, k)


@pytest.mark.parametrize("leaves_per_decode", [32, 2])
def test_a_token_tree_scores_like_each_option_on_a_fork(
        llama: LlamaCppBackend, leaves_per_decode: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import qrun.backends.llamacpp as module

    monkeypatch.setattr(module, "TREE_LEAVES", leaves_per_decode)  # 2: several decodes
    context = ids_of(llama, "Review: great sound, poor battery. Sentiment:")
    options = [" positive", " positively", " negative", " neutral", " mixed feelings"]
    rows = [ids_of(llama, o) for o in options]
    # The tree: nodes in order, parents before children (as runtime/select.py builds it).
    tokens: list[int] = []
    parents: list[int] = []
    paths: list[list[int]] = []
    index: dict[tuple[int, ...], int] = {}
    for row in rows:
        path = []
        for k in range(len(row)):
            key = tuple(row[: k + 1])
            if key not in index:
                index[key] = len(tokens)
                tokens.append(row[k])
                parents.append(index[tuple(row[:k])] if k else -1)
            path.append(index[key])
        paths.append(path)
    cache = llama.new_cache()
    llama.forward(context, cache)
    logits, tree = llama.forward_tree(tokens, parents, cache)
    assert cache.length() == len(context)
    for row, path in zip(rows, paths, strict=True):
        alone = cold(llama, context + row, logits_for=len(row))
        for k, node in enumerate(path):
            assert gap(alone[k], logits[node]) < TOLERANCE
        kept = llama.keep_path(tree, len(context), path)
        assert kept.length() == len(context) + len(path)
        after = llama.forward(ids_of(llama, "."), kept)[0]
        assert gap(cold(llama, context + row + ids_of(llama, "."))[0], after) < TOLERANCE


# --- runs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_example_runs_on_llamacpp(llama: LlamaCppBackend, name: str) -> None:
    query = qrun.Query.from_file(EXAMPLES / name, functions=functions_of(name))
    r = query.run(INPUTS[name], model=llama)
    check_values(name, r, llama)
    assert r.stats.context_tokens == len(r.token_ids)
    assert r.stats.forward_tokens > 0
    assert r.trace()["backend"] == "llamacpp"  # as --backend names it


def test_hidden_calls_and_failed_try_bodies_leave_the_context(llama: LlamaCppBackend) -> None:
    # docs/language.md §21: the KV cache is cropped back, and the run goes on from there.
    functions = qrun.Functions({"fail": lambda: 1 / 0})
    template = ('{% macro think(q) %}About {{ q }}: {{ gen t max_tokens=6 }}{% endmacro %}'
                'Notes. {% set n = think("tides") %}{% try %}Lost {{ gen u max_tokens=3 }}'
                '{{ fail() }}{% except err %}({{ err }}){% endtry %} Then: '
                '{{ gen after max_tokens=5 }}')
    r = qrun.Query(template, functions=functions).run(model=llama, seed=0)
    assert r.text.startswith("Notes. (fail() failed: ZeroDivisionError: division by zero)")
    assert llama.decode(r.token_ids) == r.text
    assert r.stats.rollback_tokens > 0


def test_every_constraint_holds(llama: LlamaCppBackend) -> None:
    r = qrun.Query(CONSTRAINED).run(model=llama)
    check_constrained(r)
    assert r.holes["name"].finish == "stop"


def test_greedy_runs_are_deterministic(llama: LlamaCppBackend) -> None:
    query = qrun.Query.from_file(EXAMPLES / "extract.tmpl")
    texts = []
    for _ in range(2):
        llama.clear_cache()
        texts.append(query.run(INPUTS["extract.tmpl"], model=llama).text)
    assert texts[0] == texts[1]


LONG_PREFIX = ("Facts about the river town of Emberwick. " * 20
               + "\nQ: {{ q }}\nA:{{ gen a stop='\\n' max_tokens=6 }}")


def test_the_prefix_cache_serves_the_shared_prefix_and_changes_nothing(
        llama: LlamaCppBackend) -> None:
    query = qrun.Query(LONG_PREFIX)
    llama.clear_cache()
    first = query.run(model=llama, q="Who founded it?")
    second = query.run(model=llama, q="How big is it?")
    again = query.run(model=llama, q="Who founded it?")
    assert first.stats.cached_tokens == 0
    assert second.stats.cached_tokens >= 200
    assert second.stats.forward_tokens < second.stats.context_tokens - 150
    assert again.text == first.text and again.stats.cached_tokens >= 200
    llama.clear_cache()
    cold_second = query.run(model=llama, q="How big is it?")
    assert cold_second.text == second.text


def test_the_prefix_cache_holds_no_cells_between_runs(llama: LlamaCppBackend) -> None:
    # Its snapshots are copies in host memory (backends/llamacpp.py HostSnapshot), not
    # sequences: llama.cpp's attention spans every cell up to the highest in use, so
    # snapshots left in the cells made every later forward dearer (issue #37).
    query = qrun.Query(LONG_PREFIX)
    llama.clear_cache()
    query.run(model=llama, q="Who founded it?")
    gc.collect()
    assert llama.prefix_cache is not None and len(llama.prefix_cache) > 0
    assert llama.free_sequences() == llama.context().n_seq_max
    assert query.run(model=llama, q="How big is it?").stats.cached_tokens >= 200


def test_a_prefix_shared_inside_one_input_is_a_cropped_sequence(llama: LlamaCppBackend) -> None:
    # The earlier run's snapshot lies past the point where the inputs part: its sequence is
    # copied and cut there (seq_cp, seq_rm), and the answer is a cold run's.
    query = qrun.Query("User: {{ message }}\nA:{{ gen a max_tokens=4 }}")
    facts = "Facts about the river town of Emberwick. " * 6
    llama.clear_cache()
    query.run(model=llama, message=facts + "Who founded it?")
    later = query.run(model=llama, message=facts + "How big is it?")
    assert later.stats.cached_tokens >= len(ids_of(llama, "User: " + facts)) - 1
    llama.clear_cache()
    assert query.run(model=llama, message=facts + "How big is it?").text == later.text


def test_speculation_checks_guesses_in_the_same_forward(llama: LlamaCppBackend) -> None:
    text = "one two three four five six seven eight nine ten. " * 3
    r = qrun.Query(text + "{{ gen again max_tokens=20 }}").run(model=llama)
    assert r.stats.drafted_tokens > 0 and r.stats.accepted_tokens > 0
    assert r.stats.forward_calls < r.stats.generated_tokens


def test_batched_runs_equal_one_at_a_time(llama: LlamaCppBackend) -> None:
    query = qrun.Query.from_file(EXAMPLES / "extract.tmpl")
    documents = [{"document": INPUTS["extract.tmpl"]["document"].replace("2024-03-18", day)}
                 for day in ("2024-03-18", "2023-11-02", "2025-01-30", "2022-07-09")]
    one_by_one = query.run_many(documents, model=llama)
    together = query.run_many(documents, model=llama, batch_size=4)
    for r in together:
        assert isinstance(r, qrun.Result)
        check_values("extract.tmpl", r, llama)
    assert [r.vars["date"] for r in together] == [r.vars["date"] for r in one_by_one]


def test_a_select_with_many_options_takes_several_tree_decodes(llama: LlamaCppBackend) -> None:
    options = [f"item {i}" for i in range(70)]  # more leaves than one decode takes
    r = qrun.Query("Pick one: {{ select pick options=opts }}").run(
        {"opts": options}, model=llama)
    assert r["pick"] in options


def test_a_select_scored_in_parts_gives_the_same_choice(
        llama: LlamaCppBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # A tree larger than TREE_NODES is scored a part at a time (memory bounded whatever the
    # number of options): the same scores and choice as one tree.
    options = [f" {w} {v}" for w in ("red", "green", "blue", "sea") for v in ("one", "two")]
    query = qrun.Query("The best colour is{{ select c options=opts }}.")
    whole = query.run({"opts": options}, model=llama)
    monkeypatch.setattr("qrun.runtime.select.TREE_NODES", 2)
    parts = query.run({"opts": options}, model=llama)
    assert parts.text == whole.text
    for option in options:
        assert abs(parts.holes["c"].option_logprobs[option]  # type: ignore[attr-defined]
                   - whole.holes["c"].option_logprobs[option]) < 0.3


# --- seams -----------------------------------------------------------------------------------


def test_seams_read_as_the_same_ids_as_on_transformers(
        llama: LlamaCppBackend, smollm2: TransformersBackend) -> None:
    check_seams(llama, smollm2)


def test_holes_end_as_on_transformers(llama: LlamaCppBackend) -> None:
    check_endings(qrun.Query(ENDINGS).run(model=llama))


def test_a_joined_input_and_a_loop_answer_as_their_literal_versions(
        llama: LlamaCppBackend) -> None:
    check_reproductions(llama)


# --- errors ----------------------------------------------------------------------------------


def test_a_context_longer_than_the_model_fails_at_its_op_like_transformers(
        llama: LlamaCppBackend, smollm2: TransformersBackend) -> None:
    query = qrun.Query("{{ text }}\n{{ gen x max_tokens=2 }}")
    long_text = "word " * (llama.max_context + 10)
    messages = []
    for backend in (llama, smollm2):
        with pytest.raises(GenerationError) as caught:
            query.run({"text": long_text}, model=backend)
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert "more than model 'smollm2' takes (8192)" in messages[0]


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelLoadError, match="llama.cpp cannot load .*broken.gguf"):
        qrun.load_model(str(bad), backend="llamacpp")
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        qrun.load_model(str(tmp_path / "missing.gguf"), backend="llamacpp")
    template = tmp_path / "hi.tmpl"
    template.write_text("Hi {{ gen x max_tokens=2 }}")
    done = subprocess.run(
        [sys.executable, "-m", "qrun.cli", str(template), "--backend", "llamacpp", "--model",
         str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert "llama.cpp cannot load" in done.stderr and "Traceback" not in done.stderr


def test_a_hugging_face_folder_is_refused(tiny_folder: str) -> None:
    with pytest.raises(ModelLoadError, match="runs .gguf files"):
        qrun.load_model(tiny_folder, backend="llamacpp")


def test_a_template_without_holes_loads_the_vocabulary_only() -> None:
    query = qrun.Query("Hello {{ name }}!")
    backend = query.load(backend="llamacpp")
    assert isinstance(backend, LlamaCppBackend) and backend.step_model() is None
    r = query.run({"name": "Ada"}, model=backend)
    assert r.text == "Hello Ada!" == backend.decode(r.token_ids)


def test_the_command_line_runs_on_llamacpp(tmp_path: Path) -> None:
    template = tmp_path / "hi.tmpl"
    template.write_text("Say hi: {{ gen x max_tokens=3 }}")
    done = subprocess.run(
        [sys.executable, "-m", "qrun.cli", str(template), "--backend", "llamacpp", "--json"],
        capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert '"x"' in done.stdout and done.stderr.strip() == ""


NO_TORCH_SCRIPT = """
import sys
import qrun
model = qrun.load_model("smollm2", backend="llamacpp")
query = qrun.Query(
    "{% user %}Pick one.{% enduser %}{% assistant %}{{ select c options=['red', 'blue'] }}: "
    "{{ gen n regex=INT max_tokens=4 }} {{ gen w max_tokens=3 temperature=0.7 seed=1 }}"
    "{% endassistant %}")
results = query.run_many([{}, {}], model=model, batch_size=2)
assert all(isinstance(r, qrun.Result) for r in results), results
print("torch" in sys.modules)
"""


def test_runs_on_llamacpp_never_import_torch() -> None:
    # The runtime is numpy throughout (runtime/sampler.py), so a llama.cpp run starts without
    # torch's ~1.4 s import (docs/language.md §18): select, a regex hole, sampling at T > 0 and
    # batching included.
    done = subprocess.run([sys.executable, "-c", NO_TORCH_SCRIPT], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False", done.stdout + done.stderr


def test_every_sequence_comes_back_after_the_runs(llama: Any) -> None:
    llama.clear_cache()
    import gc

    gc.collect()
    assert llama.free_sequences() == 256


# --- branches and contexts (docs/language.md §23) ------------------------------------------------

BRANCH_PREFIX = "".join(f"Note {i}: the {c} door of hall {i} opens at {6 + i} am.\n"
                        for i, c in enumerate(["red", "blue", "green", "white"] * 6))


def test_branches_share_the_prefix_and_run_as_one_batch(
        llama: LlamaCppBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    rows: list[int] = []
    forward_batch = llama.forward_batch

    def counting(items: Any, logits_for: int = 1) -> Any:
        rows.append(len(items))
        return forward_batch(items, logits_for)

    monkeypatch.setattr(llama, "forward_batch", counting)
    llama.clear_cache()
    template = (BRANCH_PREFIX + "{% fork i in range(6) %}Hall {{ i }}: "
                "{{ gen when regex=\"[0-9]{1,2} (am|pm)\" }}\n"
                "{{ gen note max_tokens=6 temperature=1.0 }}{% endfork %}Done.")
    r = qrun.Query(template).run(model=llama, seed=4)
    assert r.text == BRANCH_PREFIX + "Done."
    assert len(r["when"]) == len(r["note"]) == 6
    assert all(re.fullmatch(r"[0-9]{1,2} (am|pm)", w) for w in r["when"])
    assert max(rows) == 6  # the six branches went through one llama_decode together
    prefix = len(llama.encode(BRANCH_PREFIX)) + 1
    assert prefix <= r.stats.forward_tokens <= prefix + r.stats.branch_tokens
    assert r.stats.branch_tokens < prefix  # the branches did not feed the prefix again
    again = qrun.Query(template).run(model=llama, seed=4)
    assert again["note"] == r["note"]


def test_hidden_and_fresh_on_llamacpp(llama: LlamaCppBackend) -> None:
    llama.clear_cache()
    template = (BRANCH_PREFIX + "{% hidden %}Draft: {{ gen draft max_tokens=6 }}{% endhidden %}"
                "{% fresh %}Hello{{ gen f max_tokens=3 }}{% endfresh %}"
                "Final: {{ gen final regex=\"[A-Z][a-z]+\" }}")
    r = qrun.Query(template).run(model=llama)
    assert r.text == BRANCH_PREFIX + "Final: " + r["final"]
    assert r["draft"] and r["f"] is not None
    assert "Draft" not in llama.decode(r.token_ids)
    assert r.stats.forward_tokens <= r.stats.context_tokens + r.stats.rework_tokens
