"""A server that answers with something that is no result (garbage, a JSON object without
the completion's fields): the router raises ``RolloutServerError`` naming the server and the
request, and does not pass the answer on as a result (issue 38, item 6)."""

from __future__ import annotations

from typing import Any

import pytest
import sc_rollout.serving._server as server_module
from sc_rollout import GenerateRequest, RolloutServer, Router, SamplingParams
from sc_rollout.errors import RolloutServerError
from sc_rollout.testing import ToyEngine

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "answer",
    [{"choices": "garbage"}, {"id": "x"}, {"choices": [{"text": 1, "token_ids": ["a"]}]}],
    ids=["wrong-type", "no-choices", "no-token-ids"],
)
def test_an_answer_that_is_no_result_names_the_server_and_the_request(
    monkeypatch: pytest.MonkeyPatch, answer: dict[str, Any]
) -> None:
    monkeypatch.setitem(
        server_module._ROUTES, ("POST", "/v1/completions"), lambda server, body: answer
    )
    with RolloutServer(ToyEngine()) as server, Router([server.url]) as router:
        request = GenerateRequest([1, 2], SamplingParams(max_tokens=2), request_id="s3-7")
        with pytest.raises(RolloutServerError) as raised:
            router.generate(request)
        message = str(raised.value)
        assert "request s3-7" in message
        assert router.servers()[0].name in message
