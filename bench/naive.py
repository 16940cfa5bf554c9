"""The naive baseline: how template tools ran before KV reuse. The text so far is kept as a
string; each hole re-tokenizes all of it and calls `model.generate` (greedy), constrained by a
simple logits processor (qrun's own token masks, advanced on the generated tokens) and stopped
by a stop-string check; each `select` option is scored by re-encoding the whole text plus the
option, one forward per option. Same model, `inference_mode`/`no_grad` and `logits_to_keep` as
qrun where transformers allows it, so the gap measures re-encoding, not sloppiness."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.workloads import Gen, Select, Step, Text
from qrun.constraint.regex_index import IndexCache, MaskCursor


@dataclass
class NaiveRun:
    """What a naive run produced and what it cost."""

    text: str = ""
    values: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    forward_calls: int = 0
    forward_tokens: int = 0
    generate_calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"wall_s": round(self.wall_s, 4), "forward_calls": self.forward_calls,
                "forward_tokens": self.forward_tokens, "generate_calls": self.generate_calls}


class _MaskProcessor:
    """A LogitsProcessor: -inf outside the regex's token mask (EOS allowed once the value is a
    full match), the cursor advanced on the tokens generated since the last call."""

    def __init__(self, cursor: MaskCursor, prompt_len: int, max_new: int) -> None:
        self.cursor = cursor
        self.prompt_len = prompt_len
        self.max_new = max_new
        self.consumed = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        new = input_ids[0, self.prompt_len :].tolist()
        for token in new[self.consumed :]:
            self.cursor.advance(token)
        self.consumed = len(new)
        mask = torch.from_numpy(self.cursor.allowed(self.max_new - len(new)))  # [V] bool
        return scores.masked_fill(~mask.to(scores.device), float("-inf"))


class _StopOnStrings:
    """A StoppingCriteria: stop once the decoded new text contains a stop string."""

    def __init__(self, tokenizer: Any, prompt_len: int, stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.prompt_len = prompt_len
        self.stops = stops

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        text = self.tokenizer.decode(input_ids[0, self.prompt_len :], skip_special_tokens=True)
        done = any(stop in text for stop in self.stops)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class NaiveRunner:
    """Runs a workload's step list the naive way on one backend's model and tokenizer."""

    def __init__(self, backend: Any) -> None:
        from transformers import GenerationConfig

        self.backend = backend
        self.model = backend.model
        self.tokenizer = backend.tokenizer
        self.indexes = IndexCache()
        eos = sorted(backend.eos_token_ids)
        self.eos = set(eos)
        self._config: Any = GenerationConfig
        self._config_args = {"do_sample": False, "eos_token_id": eos, "pad_token_id": eos[0]}

    def run(self, steps: Sequence[Step]) -> NaiveRun:
        out = NaiveRun()
        pieces: list[str] = []
        started = time.perf_counter()
        for step in steps:
            if isinstance(step, Text):
                pieces.append(step.text)
                continue
            text = "".join(pieces)
            if isinstance(step, Gen):
                value = self._gen(text, step, out)
            else:
                value = self._select(text, step, out)
            out.values[step.name] = value
            pieces.append(value)
        out.wall_s = time.perf_counter() - started
        out.text = "".join(pieces)
        return out

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _gen(self, text: str, step: Gen, out: NaiveRun) -> str:
        from transformers import LogitsProcessorList, StoppingCriteriaList

        prompt = self._encode(text)
        input_ids = torch.tensor([prompt], device=self.model.device)
        processors = LogitsProcessorList()
        if step.pattern is not None:
            cursor = self.indexes.get(step.pattern, self.backend.vocabulary).start()
            processors.append(_MaskProcessor(cursor, len(prompt), step.max_tokens))
        criteria = StoppingCriteriaList()
        if step.stop:
            criteria.append(_StopOnStrings(self.tokenizer, len(prompt), step.stop))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            generated = self.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids),
                generation_config=self._config(**self._config_args,
                                               max_new_tokens=step.max_tokens),
                logits_processor=processors, stopping_criteria=criteria,
            )
        new = generated[0, len(prompt) :].tolist()
        out.generate_calls += 1
        out.forward_calls += len(new)
        out.forward_tokens += len(prompt) + len(new) - 1
        new = [t for t in new if t not in self.eos]
        value = str(self.tokenizer.decode(new, skip_special_tokens=True))
        cut = min((i for i in (value.find(s) for s in step.stop) if i >= 0), default=-1)
        return value if cut < 0 else value[:cut]

    def _select(self, text: str, step: Select, out: NaiveRun) -> str:
        base = self._encode(text)
        best, best_score = step.options[0], float("-inf")
        for option in step.options:
            ids = self._encode(text + option)
            start = _common_prefix(base, ids)
            start = max(1, min(start, len(ids) - 1))  # at least one option token, a context
            with torch.inference_mode():
                logits = self.model(
                    input_ids=torch.tensor([ids], device=self.model.device),
                    logits_to_keep=len(ids) - start + 1,
                ).logits[0].float()  # [L + 1, V]: positions start-1 .. end
            logprobs = torch.log_softmax(logits[:-1], dim=-1)
            targets = torch.tensor(ids[start:], device=logprobs.device)
            score = float(logprobs.gather(1, targets[:, None]).sum())
            out.forward_calls += 1
            out.forward_tokens += len(ids)
            if score > best_score:
                best, best_score = option, score
        return best


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def values_agree(naive: Mapping[str, str], qrun_values: Mapping[str, Any]) -> tuple[int, int]:
    """(holes whose naive value equals qrun's, holes)."""
    from bench.workloads import lookup

    same = sum(1 for name, value in naive.items() if str(lookup(qrun_values, name)) == value)
    return same, len(naive)
