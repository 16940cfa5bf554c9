"""The vLLM backends (tests marked `vllm`; `make test` installs vLLM's CPU build and runs them
in a pytest process of their own): the example templates on the in-process engine and on a
`vllm serve` started here on 127.0.0.1, every constraint checked, greedy outputs compared
between the two and with the transformers backend, vLLM's prefix cache seen in the stats,
batched runs, the command line, and the errors a user meets."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import regex
from test_examples import (
    CONSTRAINED,
    ENDINGS,
    EXAMPLES,
    INPUTS,
    check_constrained,
    check_endings,
    check_seams,
    check_values,
    functions_of,
)

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.constraint.patterns import PATTERNS
from qrun.errors import ConstraintError, GenerationError, ModelLoadError
from tests.vllm_serving import free_port

pytestmark = pytest.mark.vllm

# Each example run's text, per vLLM mode, for the comparisons at the end of the examples (the
# numerics differ between the engines, so a near-tie may go either way).
TEXTS: dict[str, dict[str, str]] = {"local": {}, "server": {}}

# The examples also run greedily on the transformers backend, one of each constraint kind
# (regex and select, json=, grammar=, a free `gen` with a stop): every example there costs
# about a minute of this tier, and the default tier runs them all on that backend.
COMPARED_WITH_TRANSFORMERS = ("extract.tmpl", "catalog.tmpl", "query.tmpl", "hello.tmpl")


@pytest.fixture(scope="module")
def vllm_local(vllm_engine: Any) -> Any:
    return vllm_engine


@pytest.fixture(scope="module")
def vllm_url(vllm_server_url: str) -> str:
    return vllm_server_url


@pytest.fixture(scope="module")
def vllm_remote(vllm_url: str) -> Iterator[Any]:
    backend = qrun.load_model("smollm2", backend="vllm", url=vllm_url)
    yield backend
    backend.close()  # type: ignore[attr-defined]


def runs_together(backend: Any) -> dict[str, qrun.Result | BaseException]:
    """Every example's greedy run on `backend`, started together: the engine batches them
    itself (vLLM in process; a server), so the examples cost about what the longest does, not
    their sum (alone one after another: 55 s in process, 75 s on a server). Each run's result,
    or what it raised."""
    def run(name: str) -> qrun.Result:
        query = qrun.Query.from_file(EXAMPLES / name, functions=functions_of(name))
        return query.run(INPUTS[name], model=backend)

    with ThreadPoolExecutor(len(INPUTS)) as pool:
        futures = {name: pool.submit(run, name) for name in sorted(INPUTS)}
    return {name: future.exception() or future.result() for name, future in futures.items()}


@pytest.fixture(scope="module")
def local_runs(vllm_local: Any) -> dict[str, qrun.Result | BaseException]:
    return runs_together(vllm_local)


@pytest.fixture(scope="module")
def remote_runs(vllm_remote: Any) -> dict[str, qrun.Result | BaseException]:
    return runs_together(vllm_remote)


def check_example(backend: Any, name: str, mode: str, r: qrun.Result | BaseException) -> None:
    if isinstance(r, BaseException):
        raise r
    check_values(name, r, backend)
    assert r.stats.context_tokens == len(r.token_ids)
    assert backend.tokenizer.decode(r.token_ids, skip_special_tokens=False) == r.text
    if name not in SEEDED:
        TEXTS[mode][name] = r.text


# A particles block draws its particles at temperature 1 even in a greedy run, so its output
# follows the run's seed (docs/language.md §23.5): not a greedy path to compare.
SEEDED = frozenset({"particles.tmpl"})


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_examples_on_the_in_process_engine(vllm_local: Any, local_runs: dict[str, Any],
                                           name: str) -> None:
    check_example(vllm_local, name, "local", local_runs[name])


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_examples_on_a_vllm_server(vllm_remote: Any, remote_runs: dict[str, Any],
                                   name: str) -> None:
    check_example(vllm_remote, name, "server", remote_runs[name])


def test_greedy_outputs_agree_in_process_on_a_server_and_with_transformers(
        smollm2: TransformersBackend) -> None:
    # All three run float32; only the kernels differ (vLLM's in both modes), so a near-tie
    # (two tokens within ~0.01 nats) may go the other way: one example may differ.
    compared = sorted(set(INPUTS) - SEEDED)
    assert sorted(TEXTS["local"]) == sorted(TEXTS["server"]) == compared  # every run passed
    modes = [n for n in compared if TEXTS["local"][n] == TEXTS["server"][n]]
    reference = {name: qrun.Query.from_file(EXAMPLES / name, functions=functions_of(name)).run(
        INPUTS[name], model=smollm2).text for name in COMPARED_WITH_TRANSFORMERS}
    agree = {mode: [n for n in COMPARED_WITH_TRANSFORMERS if TEXTS[mode][n] == reference[n]]
             for mode in TEXTS}
    print(f"\ngreedy agreement: in-process with server {len(modes)}/{len(compared)}; with "
          f"transformers in-process {agree['local']}, server {agree['server']} of "
          f"{list(COMPARED_WITH_TRANSFORMERS)}")
    assert len(modes) >= len(compared) - 1
    for mode in TEXTS:
        assert len(agree[mode]) >= len(COMPARED_WITH_TRANSFORMERS) - 1


@pytest.mark.parametrize("mode", ["local", "server"])
def test_seams_read_as_the_same_ids_as_on_transformers(
        vllm_local: Any, vllm_remote: Any, smollm2: TransformersBackend, mode: str) -> None:
    check_seams(vllm_local if mode == "local" else vllm_remote, smollm2)


def test_holes_end_alike_in_process_and_on_a_server(vllm_local: Any, vllm_remote: Any) -> None:
    # On a server the next text's tokens go as stop_token_ids; the replay ends the value as
    # the in-process engine does.
    local, remote = (qrun.Query(ENDINGS).run(model=b) for b in (vllm_local, vllm_remote))
    check_endings(local)
    check_endings(remote)
    assert remote.text == local.text


@pytest.mark.parametrize("mode", ["local", "server"])
def test_every_constraint_holds(vllm_local: Any, vllm_remote: Any, mode: str) -> None:
    backend = vllm_local if mode == "local" else vllm_remote
    check_constrained(qrun.Query(CONSTRAINED).run(model=backend))


@pytest.mark.parametrize("mode", ["local", "server"])
def test_a_stop_inside_a_constrained_value_ends_it_where_the_value_matches(
        vllm_local: Any, vllm_remote: Any, mode: str) -> None:
    backend = vllm_local if mode == "local" else vllm_remote
    query = qrun.Query('Three animals: {{ gen first regex="[a-z ,]+" stop="," max_tokens=12 }}, '
                       "and more.")
    r = query.run(model=backend)
    assert regex.fullmatch(r"[a-z ]+", r["first"]), r["first"]
    assert r.text == f"Three animals: {r['first']}, and more."
    assert r.holes["first"].finish == "stop"


LONG_PREFIX = ("Facts about the river town of Emberwick. " * 20
               + "\nQ: {{ q }}\nA:{{ gen a stop='\\n' max_tokens=6 }}")


def test_the_prefix_cache_serves_the_shared_prefix(vllm_local: Any) -> None:
    query = qrun.Query(LONG_PREFIX)
    vllm_local.clear_cache()
    first = query.run(model=vllm_local, q="Who founded it?")
    second = query.run(model=vllm_local, q="How big is it?")
    assert first.stats.cached_tokens == 0
    # Whole 32-position blocks of the ~200-token shared text come from vLLM's cache.
    assert second.stats.cached_tokens >= 160
    assert second.stats.forward_tokens < second.stats.context_tokens - 100


# extract.tmpl's date and paid (its five holes took 57-113 s for these eight runs on a server).
INVOICE = ("{% user %}Read this invoice and extract its fields.\n\n{{ document }}{% enduser %}\n"
           "{% assistant %}Date: {{ gen date regex=DATE }}\n"
           "Paid: {{ select paid options=['yes', 'no'] }}{% endassistant %}")


@pytest.mark.parametrize("mode", ["local", "server"])
def test_batched_runs_equal_one_at_a_time(vllm_local: Any, vllm_remote: Any, mode: str) -> None:
    backend = vllm_local if mode == "local" else vllm_remote
    query = qrun.Query(INVOICE)
    documents = [{"document": INPUTS["extract.tmpl"]["document"].replace("2024-03-18", day)}
                 for day in ("2024-03-18", "2023-11-02", "2025-01-30", "2022-07-09")]
    one_by_one = query.run_many(documents, model=backend)
    together = query.run_many(documents, model=backend, batch_size=4)
    assert [(r.vars["date"], r.vars["paid"]) for r in together] == [
        (r.vars["date"], r.vars["paid"]) for r in one_by_one]
    for r in together:
        assert isinstance(r, qrun.Result)
        assert regex.fullmatch(PATTERNS["DATE"], r.vars["date"], flags=regex.ASCII)


def test_a_constraint_the_server_cannot_read_fails_before_the_run(vllm_remote: Any) -> None:
    query = qrun.Query('A: {{ gen a max_tokens=4 }}\nB: {{ gen b regex="(^x|y)z" }}')
    with pytest.raises(ConstraintError, match="cannot be sent to the server") as caught:
        query.run(model=vllm_remote)
    assert (caught.value.span.line, caught.value.span.column) == (2, 19)  # the regex


def test_a_server_value_left_incomplete_is_an_error_not_a_value(vllm_remote: Any) -> None:
    # Two tokens cannot hold a whole date: locally the masks would refuse to start one, a
    # server cuts it off; either way no half-date comes back as a value.
    query = qrun.Query("Today is {{ gen day regex=DATE max_tokens=2 }}.")
    with pytest.raises(GenerationError, match="does not complete the constraint") as caught:
        query.run(model=vllm_remote)
    assert caught.value.span.line == 1


def test_an_unreachable_server_is_a_clear_error() -> None:
    with pytest.raises(ModelLoadError, match="cannot reach the vLLM server"):
        qrun.load_model("smollm2", backend="vllm", url=f"http://127.0.0.1:{free_port()}")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qrun.cli", *args], capture_output=True,
                          text=True, check=False, timeout=600)


@pytest.mark.parametrize("mode", ["local", "server"])
def test_an_example_from_the_command_line(vllm_local: Any, vllm_url: str, mode: str,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # qrun.cli.main in this process: a process of its own would start a second engine (about
    # 40 s of this tier) where the session's serves; the console script as a process is run by
    # tests/cli/test_cli.py and tests/test_cookbook.py. What the flags ask of the loader is
    # checked here, and the in-process engine it would start is the session's.
    from qrun import backends
    from qrun.cli import main

    real_load, asked, loaded = backends.load_model, [], []

    def load_model(**kwargs: Any) -> Any:
        options = kwargs["options"]
        asked.append((options.backend, options.url))
        if options.url is None:
            return vllm_local
        loaded.append(real_load(**kwargs))
        return loaded[-1]

    monkeypatch.setattr(backends, "load_model", load_model)
    extra = ["--url", vllm_url] if mode == "server" else []
    try:
        code = main([str(EXAMPLES / "extract.tmpl"), "--backend", "vllm", *extra, "--json",
                     "-v", f"document={INPUTS['extract.tmpl']['document']}"])
    finally:
        for backend in loaded:
            backend.close()
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    assert asked == [("vllm", vllm_url if mode == "server" else None)]
    out = json.loads(printed.out)
    assert regex.fullmatch(PATTERNS["DATE"], out["vars"]["date"], flags=regex.ASCII)
    assert out["vars"]["paid"] in ("yes", "no")
    assert out["stats"]["forward_calls"] > 0


def test_url_without_the_vllm_backend_is_a_usage_error() -> None:
    proc = _cli(str(EXAMPLES / "hello.tmpl"), "--url", "http://127.0.0.1:1")
    assert proc.returncode == 2
    assert "--url needs --backend vllm" in proc.stderr



@pytest.mark.parametrize("mode", ["local", "server"])
def test_branches_and_contexts(vllm_local: Any, vllm_remote: Any, mode: str) -> None:
    # docs/language.md §23 on vLLM: branches are concurrent requests on the shared prefix.
    backend = vllm_local if mode == "local" else vllm_remote
    prefix = "Dates of famous events, one per line.\nMoon landing: 1969-07-20\n"
    template = (prefix + "{% fork event in ['Fall of the Berlin Wall', 'First flight'] %}"
                "{{ event }}: {{ gen when regex=DATE }}\n{% endfork %}"
                "{% hidden %}Scratch: {{ gen scratch max_tokens=4 }}{% endhidden %}"
                "{% fresh %}Say yes: {{ select ok options=['yes', 'no'] }}{% endfresh %}"
                "Done.")
    r = qrun.Query(template).run(model=backend)
    assert r.text == prefix + "Done."
    assert len(r["when"]) == 2 and all(regex.fullmatch(PATTERNS["DATE"], w, flags=regex.ASCII)
                                       for w in r["when"])
    assert isinstance(r["scratch"], str) and r["ok"] in ("yes", "no")
    assert "Scratch" not in backend.tokenizer.decode(r.token_ids)


def test_no_request_is_left_holding_the_engine(vllm_local: Any) -> None:
    # vLLM's engine steps every live request together, and each step waits for the decision
    # of every request whose logits it delivered (backends/vllm_engine.py Hub.decide), up to
    # DECISION_TIMEOUT_S. A request its owner leaves awaiting held every step that long: a
    # run's particles stepped one after another (4 particles on this hole took 72 s, not 1),
    # a context dropped with its request awaiting.
    hub = vllm_local.hub
    before = hub.timed_out
    city = ('Name one city in France: {{ gen city regex="(Paris Hilton|Lyon|Marseille)" '
            'sampler="smc" particles=4 }}, or{{ select other options=[" Nice", " Metz"] }}.')
    r = qrun.Query(city).run(model=vllm_local, temperature=1.0, seed=1)
    assert len(r.holes["city"].particles or []) == 4 and r["other"] in (" Nice", " Metz")
    # A context dropped by a thread that then ends (a batch's worker): nobody else lets go of
    # its request.
    ids = vllm_local.encode("A context a worker thread drops")
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: vllm_local.forward(ids, vllm_local.new_cache()).shape).result()
    after = qrun.Query("Three:{{ gen c max_tokens=3 }}").run(model=vllm_local)
    assert after.text.startswith("Three:")
    assert hub.timed_out == before
