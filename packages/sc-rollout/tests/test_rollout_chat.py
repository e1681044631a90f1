"""The OpenAI-compatible chat front: the tool-call parser; the template applied once per turn
to the new messages (the delta rule, the end of turn the model did not generate); requests
mapped to sessions (explicit id, prefix continuation, concurrent conversations); the errors;
and a conversation with tool calls driven by the ``openai`` client records the session the
session API gives for the same conversation."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import openai
import pytest
from _rollout_helpers import END, TEMPLATE, CharChatML, scripted
from sc_rollout import AgentSession, ChatFront, ChatServer, Router, SamplingParams, ScRolloutError
from sc_rollout.chat import ChatTemplate, HermesToolCallParser, ToolCall, ToolCallParser
from sc_rollout.errors import (
    ChatHistoryError,
    ChatTemplateError,
    RolloutConfigError,
    RolloutRequestError,
    RolloutTypeError,
    SessionStateError,
    UnknownSessionError,
)
from sc_rollout.testing import ScriptedChatEngine

pytestmark = pytest.mark.timeout(30)


class Counting(CharChatML):
    """A template that renders the number of messages in the system message: the earlier
    conversation changes as messages are added."""

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        text = super().render(messages, tools=tools, add_generation_prompt=add_generation_prompt)
        return f"({len(messages)} messages)" + text


SAMPLING = SamplingParams(max_tokens=500, stop_token_ids=[END])
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL_TEXT = (
    'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    "</tool_call>"
)
ANSWER = "It is sunny in Paris."


def weather_agent(prompt: str) -> str:
    """Calls the tool, then answers from its result."""
    return ANSWER if "<|im_start|>tool" in prompt else CALL_TEXT


def _front(engine: ScriptedChatEngine | None = None, **kwargs: Any) -> ChatFront:
    return ChatFront(engine or scripted(weather_agent), TEMPLATE, sampling=SAMPLING, **kwargs)


FIRST = [
    {"role": "system", "content": "You help."},
    {"role": "user", "content": "Weather in Paris?"},
]


def _body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "scripted", "messages": messages, "tools": [WEATHER], **extra}


def _tool_reply(answer: Mapping[str, Any], result: str = "sunny, 21 C") -> list[dict[str, Any]]:
    """The messages an agent sends next: the assistant message echoed, then the tool's
    result for each call."""
    message = answer["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    tools = [{"role": "tool", "tool_call_id": c["id"], "content": result} for c in calls]
    return [message, *tools]


# --- the parser -----------------------------------------------------------------------------


def test_the_parser_reads_calls_and_keeps_the_text_outside_them() -> None:
    parser = HermesToolCallParser()
    assert isinstance(parser, ToolCallParser)
    content, calls = parser.parse(CALL_TEXT)
    assert content == "Let me look."
    assert calls == [ToolCall("get_weather", '{"city": "Paris"}')]
    two = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": "{\\"y\\": [2]}"}\n</tool_call>  '
    )
    assert parser.parse(two) == (None, [ToolCall("a", '{"x": 1}'), ToolCall("b", '{"y": [2]}')])
    assert parser.parse('<tool_call>{"name": "c"}</tool_call>')[1] == [ToolCall("c", "{}")]
    assert parser.parse("  plain answer \n") == ("plain answer", [])
    assert parser.parse("") == (None, [])
    assert ToolCall("f", "{}", id="call_1").to_dict() == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": "{}"},
    }
    assert "id" not in ToolCall("f", "{}").to_dict()


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "f", "arguments": "not json"}</tool_call>',
        '<tool_call>["f"]</tool_call>',
        '<tool_call>{"name": "f", "arguments": {}}',
    ],
)
def test_a_malformed_block_stays_in_the_content(block: str) -> None:
    text = f"before {block} after"
    content, calls = HermesToolCallParser().parse(text + ' <tool_call>{"name": "g"}</tool_call>')
    assert content == text
    assert calls == [ToolCall("g", "{}")]


def test_the_parser_takes_other_markers_and_refuses_empty_ones() -> None:
    parser = HermesToolCallParser("[CALL]", "[/CALL]")
    assert parser.parse('x[CALL]{"name": "f", "arguments": {}}[/CALL]') == (
        "x",
        [ToolCall("f", "{}")],
    )
    with pytest.raises(RolloutTypeError, match=r"start=\.\.\.\) must be a non-empty str"):
        HermesToolCallParser("")


# --- turns and the delta rule ---------------------------------------------------------------


def test_the_first_request_is_the_rendered_conversation_and_tool_calls_come_back() -> None:
    engine = scripted(weather_agent)
    front = _front(engine)
    answer = front.complete(_body(FIRST))
    sid = answer["sc_session_id"]
    (request,) = engine.requests
    prompt = TEMPLATE.render(FIRST, tools=[WEATHER], add_generation_prompt=True)
    assert request.prompt_ids == tuple(TEMPLATE.encode(prompt))
    assert (request.session_id, request.request_id) == (sid, f"{sid}-t0")
    assert request.sampling == SAMPLING
    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": f"call_{sid}_0_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    generated = len(TEMPLATE.encode(CALL_TEXT)) + 1
    assert answer["usage"] == {
        "prompt_tokens": len(request.prompt_ids),
        "completion_tokens": generated,
        "total_tokens": len(request.prompt_ids) + generated,
    }
    assert answer["object"] == "chat.completion"
    assert answer["model"] == "scripted"
    assert (answer["sc_turn"], answer["weight_version"]) == (0, 0)
    assert answer["id"] == f"chatcmpl-{sid}-t0"
    assert front.messages(sid) == [*FIRST, choice["message"]]
    assert front.sessions() == [front.session(sid)]


def test_later_turns_append_only_the_new_messages_after_the_end_of_turn() -> None:
    engine = scripted(weather_agent)
    front = _front(engine)
    first = front.complete(_body(FIRST))
    conversation = [*FIRST, *_tool_reply(first)]
    second = front.complete(_body(conversation))
    assert second["sc_session_id"] == first["sc_session_id"]
    assert second["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": ANSWER},
        "finish_reason": "stop",
        "logprobs": None,
    }
    session = front.session(first["sc_session_id"])
    turn0, appended, turn1 = session.segments
    # the model's tokens as generated (its <|im_end|> included); then, masked, the "\n" the
    # template puts after <|im_end|>, the tool message and the generation prompt
    assert turn0.token_ids == (*TEMPLATE.encode(CALL_TEXT), END)
    delta = "\n<|im_start|>tool\nsunny, 21 C<|im_end|>\n<|im_start|>assistant\n"
    assert TEMPLATE.decode(appended.token_ids) == delta
    assert appended.role == "tool"  # type: ignore[union-attr]
    assert turn1.token_ids == (*TEMPLATE.encode(ANSWER), END)
    n0, n1, n2 = (len(s.token_ids) for s in (turn0, appended, turn1))
    assert session.response_mask == (1,) * n0 + (0,) * n1 + (1,) * n2
    assert session.response_logprobs[n0 : n0 + n1] == (0.0,) * n1
    # each request's prompt is the session's sequence so far
    assert [r.prompt_ids for r in engine.requests] == [
        session.prompt_ids,
        session.prompt_ids + turn0.token_ids + appended.token_ids,
    ]
    # here the model's tool call is rendered by the template as it was generated, so the
    # session is the template's rendering of the whole conversation
    final = [*conversation, second["choices"][0]["message"]]
    text = TEMPLATE.render(final, tools=[WEATHER], add_generation_prompt=False)
    assert TEMPLATE.decode(session.token_ids) + "\n" == text
    assert front.messages(first["sc_session_id"]) == final


def test_the_model_s_tokens_are_kept_as_generated_when_the_template_writes_them_otherwise() -> None:
    spaced = 'x<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
    front = _front(scripted(lambda p: ANSWER if "<|im_start|>tool" in p else spaced))
    first = front.complete(_body(FIRST))
    front.complete(_body([*FIRST, *_tool_reply(first)]))
    session = front.session(first["sc_session_id"])
    assert TEMPLATE.decode(session.turns[0].token_ids) == spaced + "<|im_end|>"
    assert TEMPLATE.decode(session.segments[1].token_ids).startswith("\n<|im_start|>tool\n")


def test_a_turn_cut_at_max_tokens_gets_the_whole_end_of_turn_masked() -> None:
    front = _front(scripted(lambda p: "a long answer"))
    first = front.complete(_body(FIRST, max_tokens=6))
    assert first["choices"][0]["finish_reason"] == "length"
    assert first["choices"][0]["message"]["content"] == "a long"
    user = {"role": "user", "content": "go on"}
    front.complete(_body([*FIRST, first["choices"][0]["message"], user]))
    session = front.session(first["sc_session_id"])
    appended = session.segments[1]
    assert TEMPLATE.decode(appended.token_ids) == (
        "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"
    )
    assert appended.role == "user"  # type: ignore[union-attr]


def test_a_request_without_tools_is_not_parsed_for_calls() -> None:
    front = _front()
    answer = front.complete({"messages": FIRST})
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": CALL_TEXT}
    assert answer["choices"][0]["finish_reason"] == "stop"
    none = front.complete(_body(FIRST, tool_choice="none"))
    assert "tool_calls" not in none["choices"][0]["message"]


def test_sampling_comes_from_the_request_over_the_front_s_default() -> None:
    engine = scripted(weather_agent)
    front = _front(engine)
    front.complete(
        _body(FIRST, max_completion_tokens=9, max_tokens=3, temperature=0.5, top_p=0.9, seed=4)
    )
    front.complete(_body(FIRST, max_tokens=3, stop_token_ids=[END, 5]))
    first, second = (r.sampling for r in engine.requests)
    assert first == SamplingParams(9, 0.5, 0.9, 4, (END,))
    assert second == SamplingParams(3, stop_token_ids=(END, 5))


# --- one conversation, one session ----------------------------------------------------------


def test_an_explicit_session_id_names_the_session() -> None:
    front = _front()
    one = front.complete(_body(FIRST, session_id="conv-1"))
    assert one["sc_session_id"] == "conv-1"
    two = front.complete(_body([*FIRST, *_tool_reply(one)]), session_id="conv-1")
    assert two["sc_session_id"] == "conv-1"
    assert len(front.session("conv-1").turns) == 2
    # the same first messages under another id: another session
    other = front.complete(_body(FIRST), session_id="conv-2")
    assert other["sc_session_id"] == "conv-2"
    assert [s.session_id for s in front.sessions()] == ["conv-1", "conv-2"]


def test_a_conversation_is_continued_by_its_messages_and_a_changed_one_starts_anew() -> None:
    front = _front()
    first = front.complete(_body(FIRST))
    sid = first["sc_session_id"]
    # the echoed assistant message as the openai client sends it back (null fields)
    echoed = {**first["choices"][0]["message"], "refusal": None, "function_call": None}
    conversation = [*FIRST, echoed, *_tool_reply(first)[1:]]
    assert front.complete(_body(conversation))["sc_session_id"] == sid
    # an edited history is another conversation
    edited = [FIRST[0], {"role": "user", "content": "Weather in Rome?"}]
    assert front.complete(_body(edited))["sc_session_id"] != sid
    # the same messages with other tools: another conversation
    assert front.complete({"messages": conversation})["sc_session_id"] != sid
    assert len(front) == 3


def test_concurrent_conversations_stay_separate() -> None:
    def agent(prompt: str) -> str:
        city = "Rome" if "Rome" in prompt else "Paris"
        if "<|im_start|>tool" in prompt:
            return f"Sunny in {city}."
        return (
            f'<tool_call>{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}</tool_call>'
        )

    front = _front(scripted(agent))
    barrier = threading.Barrier(8)
    results: dict[int, list[dict[str, Any]]] = {}

    def converse(k: int) -> None:
        city = "Rome" if k % 2 else "Paris"
        messages = [{"role": "user", "content": f"Weather in {city}?"}]
        barrier.wait()
        first = front.complete(_body(messages))
        barrier.wait()
        second = front.complete(_body([*messages, *_tool_reply(first, city)]))
        results[k] = [first, second]

    threads = [threading.Thread(target=converse, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    ids = {k: {a["sc_session_id"] for a in answers} for k, answers in results.items()}
    assert all(len(v) == 1 for v in ids.values())
    assert len(set.union(*ids.values())) == 8
    assert len(front) == 8
    for k, (_, second) in results.items():
        city = "Rome" if k % 2 else "Paris"
        assert second["choices"][0]["message"]["content"] == f"Sunny in {city}."
        session = front.session(second["sc_session_id"])
        assert len(session.turns) == 2
        assert f"Weather in {city}?" in TEMPLATE.decode(session.prompt_ids)


def test_pop_and_close_hand_sessions_over() -> None:
    front = _front()
    first = front.complete(_body(FIRST))
    sid = first["sc_session_id"]
    session = front.pop_session(sid)
    assert len(session.turns) == 1
    assert front.sessions() == []
    with pytest.raises(UnknownSessionError, match=f"ChatFront.session\\(\\): no session '{sid}'"):
        front.session(sid)
    with pytest.raises(KeyError):
        front.messages(sid)
    # the conversation's next request starts a new session (its whole history as prompt)
    again = front.complete(_body([*FIRST, *_tool_reply(first)]))
    assert again["sc_session_id"] != sid
    closed = front.close_session(again["sc_session_id"])
    assert closed.closed
    assert len(front) == 0
    assert repr(front) == "ChatFront(model='scripted', sessions=0)"


def test_a_failed_turn_keeps_its_prompt_for_a_retry_of_the_same_request() -> None:
    engine = scripted(weather_agent)
    front = _front(engine)
    first = front.complete(_body(FIRST, session_id="r"))
    engine.fail = 1
    conversation = [*FIRST, *_tool_reply(first)]
    with pytest.raises(RuntimeError, match="the engine failed"):
        front.complete(_body(conversation))
    session = front.session("r")
    assert [type(s).__name__ for s in session.segments] == ["Turn", "AppendedTokens"]
    with pytest.raises(ChatHistoryError, match="only that request may be sent again"):
        front.complete(_body([*conversation, {"role": "user", "content": "?"}], session_id="r"))
    front.complete(_body(conversation))  # the retry, matched by its messages
    assert [type(s).__name__ for s in session.segments] == ["Turn", "AppendedTokens", "Turn"]
    assert engine.requests[-1].prompt_ids == engine.requests[-2].prompt_ids
    # a new conversation whose first turn fails is not kept
    engine.fail = 1
    with pytest.raises(RuntimeError):
        front.complete(_body([{"role": "user", "content": "hi"}]))
    assert len(front) == 1


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"n": 2}, RolloutRequestError, "n must be 1, got 2"),
        ({"stream": True}, RolloutRequestError, "stream is not supported"),
        ({"stop": ["\n"]}, RolloutRequestError, "'stop' strings are not supported"),
        ({"model": "gpt-4o"}, RolloutRequestError, "model 'gpt-4o' is not served here"),
        ({"messages": None}, RolloutTypeError, "'messages' must be a list"),
        ({"messages": []}, RolloutRequestError, "'messages' must hold at least one"),
        ({"messages": [{"role": "bot"}]}, RolloutRequestError, r"messages\[0\].role must be"),
        ({"messages": ["hi"]}, RolloutTypeError, r"messages\[0\] must be an object"),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            RolloutTypeError,
            r"messages\[0\].tool_call_id must be a non-empty str",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            RolloutRequestError,
            "only text parts are supported",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
            RolloutRequestError,
            "only an assistant message has tool_calls",
        ),
        ({"tools": "get_weather"}, RolloutTypeError, "'tools' must be a list of objects"),
        ({"tools": [{}]}, RolloutTypeError, r"tools\[0\].function must be an object, got None"),
        ({"tools": ["x"]}, RolloutTypeError, r"tools\[0\] must be an object, got 'x'"),
        (
            {"tools": [WEATHER, {"type": "custom", "custom": {"name": "f"}}]},
            RolloutRequestError,
            r"tools\[1\].type must be 'function' \(the only tools served\), got 'custom'",
        ),
        (
            {"tools": [{"function": {"name": ""}}]},
            RolloutTypeError,
            r"tools\[0\].function.name must be a non-empty str, got ''",
        ),
        (
            {"tools": [{"function": {"name": "f", "parameters": []}}]},
            RolloutTypeError,
            r"tools\[0\].function.parameters must be an object \(a JSON schema\), got \[\]",
        ),
        ({"max_tokens": 0}, RolloutRequestError, "complete: SamplingParams.max_tokens must be"),
        ({"temperature": "hot"}, RolloutTypeError, "SamplingParams.temperature must be"),
        ({"session_id": 3}, RolloutTypeError, "session_id must be a non-empty str"),
    ],
)
def test_a_bad_request_is_refused_and_records_nothing(
    change: dict[str, Any], error: type[Exception], match: str
) -> None:
    engine = scripted(weather_agent)
    front = _front(engine)
    with pytest.raises(error, match=match):
        front.complete({**_body(FIRST), **change})
    assert (engine.requests, len(front)) == ([], 0)


def test_other_bad_calls_are_refused() -> None:
    front = _front()
    with pytest.raises(RolloutTypeError, match="the body must be a JSON object"):
        front.complete([FIRST])  # type: ignore[arg-type]
    with pytest.raises(RolloutRequestError, match="in the body and X-Session-Id 'b' differ"):
        front.complete(_body(FIRST, session_id="a"), session_id="b")
    with pytest.raises(RolloutTypeError, match="takes a RolloutEngine or a Router, got str"):
        ChatFront("http://x", TEMPLATE)  # type: ignore[arg-type]
    with pytest.raises(RolloutTypeError, match="takes a ChatTemplate"):
        ChatFront(scripted(weather_agent), object())  # type: ignore[arg-type]
    with pytest.raises(RolloutTypeError, match="takes a ToolCallParser"):
        ChatFront(scripted(weather_agent), TEMPLATE, parser=object())  # type: ignore[arg-type]
    with pytest.raises(RolloutTypeError, match="takes a SamplingParams"):
        ChatFront(scripted(weather_agent), TEMPLATE, sampling={})  # type: ignore[arg-type]
    with Router() as router:
        with pytest.raises(RolloutConfigError, match="give model="):
            ChatFront(router, TEMPLATE)
        assert ChatFront(router, TEMPLATE, model="m").model == "m"
    assert isinstance(TEMPLATE, ChatTemplate)


def test_a_named_session_whose_history_differs_is_refused() -> None:
    front = _front()
    first = front.complete(_body(FIRST, session_id="h"))
    edited = [FIRST[0], {"role": "user", "content": "Weather in Rome?"}, *_tool_reply(first)]
    with pytest.raises(
        ChatHistoryError, match=r"session h: .* messages\[1\] \(user: 'Weather in Rome\?'\)"
    ):
        front.complete(_body(edited, session_id="h"))
    with pytest.raises(ChatHistoryError, match="fewer than the 3 the session recorded"):
        front.complete(_body(FIRST, session_id="h"))
    with pytest.raises(ChatHistoryError, match="tools differ"):
        front.complete({"messages": [*FIRST, *_tool_reply(first)], "session_id": "h"})
    assert isinstance(ChatHistoryError("x"), (RolloutRequestError, ValueError, ScRolloutError))
    assert len(front.session("h").segments) == 1


def test_a_template_that_rewrites_the_conversation_so_far_is_a_clear_error() -> None:
    front = ChatFront(scripted(weather_agent), Counting(), sampling=SAMPLING)
    first = front.complete(_body(FIRST, session_id="div"))
    with pytest.raises(ChatTemplateError, match=r"session div\).* part at character 1: ") as e:
        front.complete(_body([*FIRST, *_tool_reply(first)], session_id="div"))
    assert "'(3 messages)" in str(e.value)
    assert "'(4 messages)" in str(e.value)
    assert len(front.session("div").segments) == 1  # nothing appended


def test_a_second_request_of_a_session_in_flight_is_refused() -> None:
    release = threading.Event()
    calls: list[str] = []

    def slow(prompt: str) -> str:
        calls.append(prompt)
        if len(calls) == 1:  # the first request waits in the engine
            release.wait(10)
        return "done"

    front = _front(scripted(slow))
    thread = threading.Thread(target=front.complete, args=(_body(FIRST, session_id="busy"),))
    thread.start()
    try:
        while not front.sessions():
            release.wait(0.01)
        with pytest.raises(SessionStateError, match="session busy has a request in flight"):
            front.complete(_body(FIRST, session_id="busy"))
        # without the id, the conversation in flight is not continued: a new session
        assert front.complete(_body(FIRST, max_tokens=1))["sc_session_id"] != "busy"
    finally:
        release.set()
        thread.join(10)


# --- over HTTP, with the openai client ------------------------------------------------------


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with ChatServer(_front()) as chat:
        yield chat


def _client(server: ChatServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=20)


def test_the_openai_client_drives_a_conversation_with_tool_calls(server: ChatServer) -> None:
    client = _client(server)
    messages: list[Any] = [dict(m) for m in FIRST]
    tools: Any = [WEATHER]
    first = client.chat.completions.create(model="scripted", messages=messages, tools=tools)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [  # type: ignore[union-attr]
        ("get_weather", {"city": "Paris"})
    ]
    sid = (first.model_extra or {})["sc_session_id"]
    messages.append(choice.message)  # as agent code does: the client serializes it back
    messages += [{"role": "tool", "tool_call_id": c.id, "content": "sunny, 21 C"} for c in calls]
    second = client.chat.completions.create(model="scripted", messages=messages, tools=tools)
    assert second.choices[0].message.content == ANSWER
    assert second.choices[0].finish_reason == "stop"
    assert (second.model_extra or {})["sc_session_id"] == sid
    assert second.usage is not None
    assert second.usage.completion_tokens == len(ANSWER) + 1
    recorded = server.front.session(sid)

    # the same conversation through the session API, with the template's delta by hand
    direct = AgentSession(
        scripted(weather_agent),
        TEMPLATE.encode(TEMPLATE.render(FIRST, tools=[WEATHER], add_generation_prompt=True)),
        session_id=sid,
        sampling=SAMPLING,
    )
    direct.generate()
    direct.append_tokens(
        TEMPLATE.encode("\n<|im_start|>tool\nsunny, 21 C<|im_end|>\n<|im_start|>assistant\n")
    )
    direct.generate()
    assert recorded.to_dict() == direct.to_dict()

    # the session id from the client: extra_body or a header
    named = client.chat.completions.create(
        model="scripted", messages=messages[:2], tools=tools, extra_body={"session_id": "mine"}
    )
    assert (named.model_extra or {})["sc_session_id"] == "mine"
    header = client.chat.completions.create(
        model="scripted", messages=messages[:2], extra_headers={"X-Session-Id": "hdr"}
    )
    assert (header.model_extra or {})["sc_session_id"] == "hdr"
    assert [m.id for m in client.models.list().data] == ["scripted"]


def test_errors_come_back_as_openai_errors(server: ChatServer) -> None:
    client = _client(server)
    messages: Any = FIRST
    with pytest.raises(openai.BadRequestError, match="n must be 1") as e:
        client.chat.completions.create(model="scripted", messages=messages, n=2)
    assert e.value.status_code == 400
    assert isinstance(e.value.body, dict)
    assert e.value.body["type"] == "RolloutRequestError"
    with pytest.raises(openai.BadRequestError, match="model 'gpt' is not served here"):
        client.chat.completions.create(model="gpt", messages=messages)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="scripted", prompt="x")


def test_the_server_binds_loopback_and_answers_health(server: ChatServer) -> None:
    assert server.host == "127.0.0.1"
    assert server.url == f"http://127.0.0.1:{server.port}/v1"
    assert repr(server) == f"ChatServer({server.url}, model='scripted')"
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ok", "model": "scripted", "sessions": 0}
    with pytest.raises(RolloutConfigError, match="binds every interface"):
        ChatServer(server.front, host="0.0.0.0")
    with pytest.raises(RolloutTypeError, match="takes a ChatFront"):
        ChatServer(object())  # type: ignore[arg-type]
    with pytest.raises(RolloutConfigError, match="port must be an int"):
        ChatServer(server.front, port=70000)
    stopped = ChatServer(server.front)
    stopped.stop()
    with pytest.raises(RolloutConfigError, match=r"start\(\) after stop\(\)"):
        stopped.start()
