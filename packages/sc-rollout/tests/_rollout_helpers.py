"""Helpers of the sc-rollout tests: servers on threads, requests, waiting for a condition, and
the chat tests' template (ChatML over characters) and scripted engine."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import settings
from sc_rollout import GenerateRequest, RolloutServer, SamplingParams
from sc_rollout.testing import ScriptedChatEngine, ToyEngine, ToyEngineConfig

PROPERTY = settings(deadline=None, max_examples=40)

T = TypeVar("T")
R = TypeVar("R")


@contextmanager
def toy_servers(*configs: ToyEngineConfig) -> Iterator[list[RolloutServer]]:
    """One toy-engine server per config, each on a thread of this process."""
    servers = [RolloutServer(ToyEngine(config)).start() for config in configs]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def request(
    prompt: Sequence[int] = (1, 2, 3),
    *,
    max_tokens: int = 4,
    seed: int | None = 0,
    session: str | None = None,
    request_id: str | None = None,
) -> GenerateRequest:
    extra = {} if request_id is None else {"request_id": request_id}
    return GenerateRequest(
        prompt_ids=tuple(prompt),
        sampling=SamplingParams(max_tokens=max_tokens, seed=seed),
        session_id=session,
        **extra,
    )


def in_threads(fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``fn`` over ``items`` on ``workers`` threads, results in order."""
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Poll ``predicate`` until it holds; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


# --- raw HTTP, for malformed requests -----------------------------------------------------


@dataclass(frozen=True)
class RawAnswer:
    """An HTTP answer as it came: its status, its headers (names in lower case), its body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http_request(
    method: str, path: str, headers: Sequence[tuple[str, str]] = (), body: bytes = b""
) -> bytes:
    """The bytes of one HTTP/1.1 request, headers exactly as given (none added)."""
    head = "".join(f"{name}: {value}\r\n" for name, value in headers)
    return f"{method} {path} HTTP/1.1\r\n{head}\r\n".encode("latin-1") + body


def exchange(
    host: str, port: int, data: bytes, *, timeout_s: float = 10.0, half_close: bool = True
) -> RawAnswer:
    """Send ``data`` on a connection of its own (then end the sending side, unless
    ``half_close`` is false) and read the answer until the server closes; a server that
    does not answer within ``timeout_s`` fails with ``TimeoutError``."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks: list[bytes] = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    raw = b"".join(chunks)
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise AssertionError(f"no HTTP answer, got {raw[:200]!r}")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawAnswer(int(status_line.split(" ")[1]), headers, body)


# --- the chat front's template and engine ---------------------------------------------------

SPECIAL = ("<|im_start|>", "<|im_end|>")
START, END = 0, 1  # token ids of the special tokens; a character c is ord(c) + 2


class CharChatML:
    """A ChatML chat template over a character-level tokenizer whose two special tokens are
    one token each; tools are listed in the system message, a tool call is rendered as
    ``<tool_call>`` JSON ``</tool_call>`` (arguments re-serialized unless given as a string,
    as Hugging Face templates do), a tool result as a ``tool`` message."""

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        out: list[str] = []
        rest = list(messages)
        if tools:
            system = rest.pop(0)["content"] if rest and rest[0]["role"] == "system" else ""
            listed = "\n".join(json.dumps(t["function"], sort_keys=True) for t in tools)
            out.append(f"<|im_start|>system\n{system}\n# Tools\n{listed}<|im_end|>\n")
        for message in rest:
            body = message["content"]
            for call in message.get("tool_calls", []):
                fn, arguments = call["function"], call["function"]["arguments"]
                if not isinstance(arguments, str):  # OpenAI's JSON string is taken as it is
                    arguments = json.dumps(arguments)
                payload = f'{{"name": {json.dumps(fn["name"])}, "arguments": {arguments}}}'
                body += f"\n<tool_call>\n{payload}\n</tool_call>"
            out.append(f"<|im_start|>{message['role']}\n{body}<|im_end|>\n")
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
        return "".join(out)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            for k, special in enumerate(SPECIAL):
                if text.startswith(special, i):
                    ids.append(k)
                    i += len(special)
                    break
            else:
                ids.append(ord(text[i]) + 2)
                i += 1
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(SPECIAL[t] if t < 2 else chr(t - 2) for t in token_ids)


TEMPLATE = CharChatML()


def scripted(reply: Callable[[str], str]) -> ScriptedChatEngine:
    """sc_rollout.testing's scripted chat engine on the character template: its answer to a
    prompt is ``reply(prompt text)``, ended by ``<|im_end|>`` (a stop token)."""
    return ScriptedChatEngine(TEMPLATE, END, reply)
