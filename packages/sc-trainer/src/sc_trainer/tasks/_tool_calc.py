"""The tool task (``sc-demo --task tool-calc``): modular multiplication, with a calculator
the policy may call.

A prompt is ``<bos>37*48%97=``; the right answer is ``37 * 48 mod 97`` as 2 digits (``30``),
then an end-of-sequence token. Modular multiplication is what small transformers learn only
after thousands of steps (if at all), so without the tool the policy can do little better
than guess digits. But it has a tool: a first model turn that is the call mark ``[`` alone
runs the calculator on the question, whose answer the agent appends as tool tokens (``30=``,
response mask 0); the model then answers in a second turn, where the call mark is banned
(one call per session), and copying the tool's digits earns the full reward. The engine
samples that turn from the model's distribution renormalised over the other tokens, and the
batch's ``banned_token_ids`` column has the actor compute the same one. The reward is
the fraction of the 2 digits right in the last model turn, position by position: a uniform
policy scores about 1/16 per digit, the best possible is 1. Nothing rewards the call itself.

Exploration: calling pays only once the policy copies the tool's answer, and copying is
learnt only where the answer is in the context. So a ``hint_rate`` share of the training
sessions (3 in 4, a fixed draw of each session's id) are hints: the call mark and the
calculator's answer are already in the context as tool tokens (the environment offers the
calculator), and the model only answers. The hints teach copying; the policy's own rare
calls then earn far more than guessing, and its call rate rises to every non-hint session
within about 25 steps. Validation runs no hints: one greedy session per held-out problem,
the policy calling (or not) by itself. The trainer guide says what else was tried.

Every session runs on the rollout servers through :class:`sc_rollout.AgentLoop`: at most
two model turns and one tool call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from sc_protocol import DataProto
from sc_rollout import AgentSession, AgentTask, SamplingParams

from .._errors import TaskError
from .._scores import BatchScores
from ..agents import agent_token_scores
from ._digits import sample_distinct

__all__ = ["TOOL_CALC_CHARS", "ToolCalcTask"]

#: the characters of the tool task, one token each in its tiny GPT-2's tokenizer
TOOL_CALC_CHARS = list("0123456789*%=[]")

MODULUS = 97  # operands are 0..96, written with 2 digits; so is the answer
_DIGITS = 2
_TURN_TOKENS = _DIGITS + 1  # a turn: the answer and an eos, or a call


class ToolCalcTask:
    """Prompts, the calculator agent and the reward of the tool task, through ``tokenizer``
    (a Hugging Face tokenizer with pad, bos and eos tokens; the run's model's).

    ``tool_latency_s`` delays each tool call (a slow tool, for tests and benchmarks);
    ``num_val`` problems are held out for validation (``split_seed`` picks them);
    ``hint_rate`` of the training sessions are hints (see the module's documentation).
    """

    CALL = "["
    #: what the calculator's answer ends with (the prompt's ``=``: the answer follows it)
    CLOSE = "="

    def __init__(
        self,
        tokenizer: Any,
        *,
        num_val: int = 256,
        split_seed: int = 1234,
        tool_latency_s: float = 0.0,
        hint_rate: float = 0.75,
    ) -> None:
        for name in ("pad_token_id", "eos_token_id"):
            if not isinstance(getattr(tokenizer, name, None), int):
                raise TaskError(
                    f"ToolCalcTask: the tokenizer has no {name} (got "
                    f"{getattr(tokenizer, name, None)!r})"
                )
        if tool_latency_s < 0:
            raise TaskError(f"ToolCalcTask: tool_latency_s must be >= 0, got {tool_latency_s}")
        if not 0.0 <= hint_rate < 1.0:
            raise TaskError(f"ToolCalcTask: hint_rate must be in [0, 1), got {hint_rate}")
        self.hint_rate = float(hint_rate)
        self.tokenizer = tokenizer
        self.tool_latency_s = float(tool_latency_s)
        bos = getattr(tokenizer, "bos_token_id", None)
        self._bos: list[int] = [bos] if isinstance(bos, int) else []
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.pad_token_id = int(tokenizer.pad_token_id)
        call = self._encode(self.CALL)
        if len(call) != 1:
            raise TaskError(
                f"ToolCalcTask: the call mark {self.CALL!r} must be one token of the tokenizer, "
                f"got {call}"
            )
        self.call_token_id = call[0]
        everything = np.array(
            [f"{a:02d}*{b:02d}" for a in range(MODULUS) for b in range(MODULUS)], dtype=object
        )
        if not 1 <= num_val <= len(everything) // 2:
            raise TaskError(
                f"ToolCalcTask: num_val must be in 1..{len(everything) // 2}, got {num_val}"
            )
        order = np.random.default_rng(split_seed).permutation(len(everything))
        self.val_strings: np.ndarray = everything[np.sort(order[:num_val])]
        self.train_strings: np.ndarray = everything[np.sort(order[num_val:])]
        self._prompt_length = max(len(self.prompt_ids(str(t))) for t in everything)
        tool = len(self._encode("0" * _DIGITS + self.CLOSE))
        self._response_length = 2 * _TURN_TOKENS + tool

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # --- shapes and prompts -------------------------------------------------------------------

    @property
    def prompt_length(self) -> int:
        """Tokens of the longest prompt."""
        return self._prompt_length

    @property
    def response_length(self) -> int:
        """Tokens of the longest session after its prompt: two model turns and a tool answer."""
        return self._response_length

    @property
    def turn_tokens(self) -> int:
        """The most tokens one model turn generates."""
        return _TURN_TOKENS

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """A model turn ends with the eos token or with the call mark."""
        return (self.eos_token_id, self.call_token_id)

    def sample_train(self, n: int, seed: int, step: int) -> np.ndarray:
        """``n`` distinct training problems, a function of ``(seed, step)`` only."""
        return sample_distinct(self.train_strings, n, seed, step, "ToolCalcTask.sample_train")

    def prompt_ids(self, problem: str) -> list[int]:
        """The prompt of ``problem`` (``"37*48"``): bos, the problem, ``%97`` and ``=``."""
        self._operands(problem)
        return self._bos + self._encode(f"{problem}%{MODULUS}=")

    @staticmethod
    def _operands(problem: str) -> tuple[int, int]:
        a, sep, b = problem.partition("*")
        if not sep or not (a.isdigit() and b.isdigit()):
            raise TaskError(f"ToolCalcTask: problem {problem!r} is not '<a>*<b>'")
        return int(a), int(b)

    def answer(self, problem: str) -> str:
        """The right answer: the product modulo 97, 2 digits."""
        a, b = self._operands(problem)
        return str(a * b % MODULUS).zfill(_DIGITS)

    # --- the agent ----------------------------------------------------------------------------

    def _tool_answer(self, problem: str) -> list[int]:
        """The calculator's answer to ``problem`` as tool tokens (``30=``)."""
        return self._encode(self.answer(problem) + self.CLOSE)

    def _call_and_answer(self, problem: str) -> list[int]:
        """A hint's tokens: the call mark and the calculator's answer."""
        return [self.call_token_id, *self._tool_answer(problem)]

    def _answer_sampling(self, session: AgentSession) -> SamplingParams:
        """The answer turn after a call: the call mark is banned (one call per session) and
        the turn ends with the eos token. The session's turn records the ban, and the agent
        batch hands it to the actor (``banned_token_ids``), which renormalises as the engine
        sampled."""
        return dataclasses.replace(
            session.sampling,
            max_tokens=_TURN_TOKENS,
            stop_token_ids=(self.eos_token_id,),
            banned_token_ids=(self.call_token_id,),
        )

    def score(self, problem: str, answer_ids: Sequence[int]) -> float:
        """The fraction of the 2 digits of ``problem``'s answer that the decoded
        ``answer_ids`` have right, position by position (special tokens dropped)."""
        text = "".join(self.tokenizer.decode(list(answer_ids), skip_special_tokens=True).split())
        target = self.answer(problem)
        return sum(a == b for a, b in zip(text, target, strict=False)) / _DIGITS

    def score_batch(self, batch: DataProto) -> BatchScores:
        """The per-token reward of a batch of agent sessions: each session's reward, which
        its agent returned, on its last model token (:func:`agent_token_scores`)."""
        return BatchScores(agent_token_scores(batch), {})

    def hinted(self, session_id: str) -> bool:
        """Whether the training session ``session_id`` is a hint (a fixed draw of its id)."""
        draw = zlib.crc32(f"hint:{session_id}".encode()) / 0xFFFFFFFF
        return draw < self.hint_rate

    async def agent(self, task: AgentTask, session: AgentSession) -> float:
        """The training agent. A hint session (``hint_rate`` of them) starts with the
        calculator's call and answer already in the context, as tool tokens, and the model
        only answers; the others run :meth:`eval_agent`'s session. Returns the score."""
        if self.hinted(task.session_id):
            problem = str(task.data)
            session.append_tokens(self._call_and_answer(problem), role="hint")
            turn = await session.agenerate(sampling=self._answer_sampling(session))
            return self.score(problem, turn.token_ids)
        return await self.eval_agent(task, session)

    async def eval_agent(self, task: AgentTask, session: AgentSession) -> float:
        """The policy on its own (validation, and the training sessions that are not hints):
        a model turn; if it is the call mark alone (a turn that ends with the mark after
        other tokens is an answer, and a wrong one), the calculator's answer is appended as
        tool tokens and the model answers in a second turn. Returns the score of the last
        model turn."""
        problem = str(task.data)
        turn = await session.agenerate(max_tokens=_TURN_TOKENS)
        if turn.token_ids == (self.call_token_id,):  # a call is a turn of its own
            if self.tool_latency_s:
                await asyncio.sleep(self.tool_latency_s)
            session.append_tokens(self._tool_answer(problem))
            turn = await session.agenerate(sampling=self._answer_sampling(session))
        return self.score(problem, turn.token_ids)

    def tasks(self, problems: Sequence[str], group: str, n: int) -> list[AgentTask]:
        """``n`` sessions of each of ``problems``; problem ``i``'s group is
        ``<group>-<i>`` and its sessions are ``<group>-<i>-<k>``."""
        out = []
        for i, problem in enumerate(problems):
            prompt = self.prompt_ids(str(problem))
            for k in range(n):
                out.append(
                    AgentTask(
                        prompt, f"{group}-{i}", data=str(problem), session_id=f"{group}-{i}-{k}"
                    )
                )
        return out
