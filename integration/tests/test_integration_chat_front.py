"""The chat front on a real Hugging Face tokenizer and chat template (built in code, saved and
loaded back as a user's checkpoint would be): ``HFChatTemplate`` renders with tools, the
template's ``"<|im_end|>\\n"`` after an assistant turn is appended masked (only its ``"\\n"``
when the model generated the ``<|im_end|>``), and a conversation with tool calls through the
``openai`` client records the session the session API gives for the same conversation."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from sc_rollout import (
    AgentSession,
    ChatFront,
    ChatServer,
    SamplingParams,
)
from sc_rollout.chat import ChatTemplate, HFChatTemplate
from sc_rollout.errors import ChatTemplateError, RolloutTypeError
from sc_rollout.testing import ScriptedChatEngine

pytestmark = pytest.mark.timeout(60)

#: ChatML with tools in the system message and tool results as <tool_response> user turns
#: (the layout of Qwen2.5's template, written anew)
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- endif %}"
    "{{- '\\n# Tools\\n' }}"
    "{%- for tool in tools %}{{- tool.function | tojson }}{{- '\\n' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + message.content }}"
    "{%- for call in message.tool_calls or [] %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \' }}'
    "{{- call.function.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content }}"
    "{{- '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message.role != 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

SPECIAL = ["<unk>", "<|im_start|>", "<|im_end|>"]
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A character-level fast tokenizer with ChatML's two special tokens and the chat
    template above, saved with ``save_pretrained`` and loaded with ``AutoTokenizer``."""
    transformers: Any = importlib.import_module("transformers")
    tokenizers: Any = importlib.import_module("tokenizers")
    vocab = {tok: i for i, tok in enumerate([*SPECIAL, *CHARS])}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Split(
        tokenizers.Regex("[\\s\\S]"), behavior="isolated"
    )
    backend.decoder = tokenizers.decoders.Fuse()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    path: Path = tmp_path_factory.mktemp("chat-tokenizer")
    fast.save_pretrained(str(path))
    return transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def template(tokenizer: Any) -> HFChatTemplate:
    return HFChatTemplate(tokenizer)


def _end(tokenizer: Any) -> int:
    end: int = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return end


def scripted(template: HFChatTemplate, end: int, reply: Callable[[str], str]) -> ScriptedChatEngine:
    """sc_rollout.testing's scripted chat engine: answers ``reply(prompt text)`` followed by
    ``<|im_end|>`` (a stop token), cut at ``max_tokens``."""
    return ScriptedChatEngine(template, end, reply, model="tiny-chatml")


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    }
]
FIRST = [
    {"role": "system", "content": "You add."},
    {"role": "user", "content": "What is 2 + 3?"},
]
CALL = 'I will add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
ANSWER = "2 + 3 = 5."
DELTA = (
    "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
)


def _for_template(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as the front gives it to a template: content a str, tool-call arguments
    parsed (what Hugging Face templates expect)."""
    out = {**message, "content": message["content"] or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                **c,
                "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])},
            }
            for c in message["tool_calls"]
        ]
    return out


def agent(prompt: str) -> str:
    return ANSWER if "<tool_response>" in prompt else CALL


@pytest.fixture
def server(template: HFChatTemplate, tokenizer: Any) -> Iterator[ChatServer]:
    engine = scripted(template, _end(tokenizer), agent)
    sampling = SamplingParams(max_tokens=400, stop_token_ids=[_end(tokenizer)])
    with ChatServer(ChatFront(engine, template, sampling=sampling)) as chat:
        yield chat


def test_the_hf_template_renders_with_tools_and_round_trips(
    template: HFChatTemplate, tokenizer: Any
) -> None:
    assert isinstance(template, ChatTemplate)
    text = template.render(FIRST, tools=TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou add.\n# Tools\n{")
    assert text.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    ids = template.encode(text)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert template.decode(ids) == text
    with pytest.raises(RolloutTypeError, match="needs a tokenizer with apply_chat_template"):
        HFChatTemplate(object())


def test_a_failing_template_is_a_chat_template_error(tokenizer: Any) -> None:
    broken = HFChatTemplate(tokenizer, chat_template="{{ raise_exception('roles!') }}")
    with pytest.raises(ChatTemplateError, match=r"chat template failed on 1 messages: .*roles!"):
        broken.render([{"role": "user", "content": "x"}], tools=None, add_generation_prompt=True)


def test_the_end_of_turn_the_model_did_not_generate_is_appended_masked(
    template: HFChatTemplate, tokenizer: Any
) -> None:
    end = _end(tokenizer)
    engine = scripted(template, end, agent)
    front = ChatFront(engine, template, sampling=SamplingParams(400, stop_token_ids=[end]))
    first = front.complete({"messages": FIRST, "tools": TOOLS})
    message = first["choices"][0]["message"]
    (call,) = message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}
    tool = {"role": "tool", "tool_call_id": call["id"], "content": "5"}
    front.complete({"messages": [*FIRST, message, tool], "tools": TOOLS})
    session = front.session(first["sc_session_id"])
    turn0, appended, turn1 = session.segments
    assert turn0.token_ids[-1] == end  # the model's <|im_end|>, kept as generated
    assert template.decode(appended.token_ids) == DELTA  # the template's "\n" is masked
    assert session.response_mask[len(turn0.token_ids)] == 0
    # the template renders the whole conversation as the session holds it (plus its "\n")
    final = [*FIRST, message, tool, *front.messages(session.session_id)[-1:]]
    rendered = template.render(
        [_for_template(m) for m in final], tools=TOOLS, add_generation_prompt=False
    )
    assert template.decode(session.token_ids) + "\n" == rendered
    assert (
        engine.requests[1].prompt_ids == session.prompt_ids + turn0.token_ids + appended.token_ids
    )
    assert turn1.token_ids == (*template.encode(ANSWER), end)

    # cut at max_tokens: no <|im_end|> generated, so all of "<|im_end|>\n" is appended masked
    cut = front.complete({"messages": FIRST, "max_tokens": 4})
    follow = [*FIRST, cut["choices"][0]["message"], {"role": "user", "content": "and?"}]
    front.complete({"messages": follow})
    segments = front.session(cut["sc_session_id"]).segments
    assert cut["choices"][0]["finish_reason"] == "length"
    assert template.decode(segments[1].token_ids).startswith("<|im_end|>\n<|im_start|>user\n")


def test_the_openai_client_records_the_session_the_session_api_gives(
    server: ChatServer, template: HFChatTemplate, tokenizer: Any
) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=30)
    messages: list[Any] = [dict(m) for m in FIRST]
    tools: Any = TOOLS
    first = client.chat.completions.create(model="tiny-chatml", messages=messages, tools=tools)
    assert first.choices[0].finish_reason == "tool_calls"
    calls = first.choices[0].message.tool_calls or []
    assert len(calls) == 1
    messages.append(first.choices[0].message)
    messages += [{"role": "tool", "tool_call_id": c.id, "content": "5"} for c in calls]
    second = client.chat.completions.create(model="tiny-chatml", messages=messages, tools=tools)
    assert second.choices[0].message.content == ANSWER
    sid = (second.model_extra or {})["sc_session_id"]
    assert (first.model_extra or {})["sc_session_id"] == sid

    end = _end(tokenizer)
    direct = AgentSession(
        scripted(template, end, agent),
        template.encode(template.render(FIRST, tools=TOOLS, add_generation_prompt=True)),
        session_id=sid,
        sampling=SamplingParams(max_tokens=400, stop_token_ids=[end]),
    )
    direct.generate()
    direct.append_tokens(template.encode(DELTA))
    direct.generate()
    assert server.front.session(sid).to_dict() == direct.to_dict()
