"""One decoding step's pieces: a request in flight (:class:`Flight`), the raw next-token
logits of a batch of sequences (one forward over them, left-padded, no key/value cache),
and the choice of one request's next token with its log-probability."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from sc_rollout import GenerateRequest, GenerateResult, SamplingParams
from sc_rollout.engines import FinishReason
from torch import Tensor, nn

from ..models import window_row
from ..workers._sampling import filter_logits

__all__ = ["Flight", "next_logits", "pick"]


class Flight:
    """A request in flight: its tokens so far with their log-probs and weight versions, its
    sampling generator, whether it was aborted, and once it ended its result (or the error
    that ended it). The scheduler thread writes it; ``done`` tells the caller."""

    __slots__ = (
        "aborted",
        "done",
        "error",
        "generator",
        "logprobs",
        "request",
        "result",
        "stops",
        "tokens",
        "versions",
    )

    def __init__(self, request: GenerateRequest, device: torch.device) -> None:
        self.request = request
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.stops = frozenset(request.sampling.stop_token_ids)
        self.generator = torch.Generator(device=device)
        seed = request.sampling.seed
        if seed is None:
            self.generator.seed()  # fresh randomness
        else:
            self.generator.manual_seed(seed % (1 << 64))
        self.aborted = False
        self.done = threading.Event()
        self.result: GenerateResult | None = None
        self.error: BaseException | None = None

    @property
    def sequence(self) -> list[int]:
        """The prompt and the tokens so far."""
        return [*self.request.prompt_ids, *self.tokens]

    def record(self, token: int, logprob: float, version: int) -> FinishReason | None:
        """Add a sampled token; why the request ends now (``None``: it goes on)."""
        self.tokens.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        if token in self.stops:
            return "stop"
        if len(self.tokens) >= self.request.sampling.max_tokens:
            return "length"
        return None

    def finish(self, reason: FinishReason, version: int) -> None:
        """End the request: its result (``version``: the engine's, if no token was made)."""
        versions = self.versions or [version]
        self.result = GenerateResult(
            request_id=self.request.request_id,
            token_ids=tuple(self.tokens),
            logprobs=tuple(self.logprobs),
            finish_reason=reason,
            weight_version=versions[-1],
            min_weight_version=versions[0],
        )
        self.done.set()

    def fail(self, error: BaseException) -> None:
        """End the request with ``error`` (its caller raises it)."""
        self.error = error
        self.done.set()


@torch.no_grad()
def next_logits(
    model: nn.Module,
    sequences: Sequence[Sequence[int]],
    device: torch.device,
    exact_window: int = 0,
) -> Tensor:
    """The raw next-token logits of each sequence, ``[batch, vocab]`` float32: one forward
    of ``model`` (``forward(input_ids, attention_mask, position_ids)``) over the sequences
    left-padded to the longest, positions counted from each one's first real token. In the
    exact mode (``exact_window`` > 0) one forward per sequence instead, alone in a row of
    ``exact_window`` tokens (:func:`~sc_workers.models.window_row`), as the actor recomputes
    it then (:func:`~sc_workers.models.window_forward`)."""
    if exact_window:
        rows = []
        for sequence in sequences:
            ids, mask, positions = window_row(sequence, exact_window, "TorchRolloutEngine")
            out: Tensor = model(ids.to(device), mask.to(device), positions.to(device))
            rows.append(out[:, len(sequence) - 1, :])
        return torch.cat(rows).float()
    width = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, width - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
        mask[row, width - len(sequence) :] = 1
    positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
    logits: Tensor = model(ids.to(device), mask.to(device), positions.to(device))
    return logits[:, -1, :].float()


@torch.no_grad()
def pick(logits: Tensor, sampling: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    """One request's next token from its raw ``logits`` ``[vocab]`` and that token's
    log-probability under them (``log_softmax`` of the logits divided by the temperature,
    before top-p, float32: what the actor's ``compute_log_prob`` recomputes; greedy
    requests, and a temperature so small that the divided logits overflow, report the raw
    logits' ``log_softmax``). Temperature 0 is greedy (the first most likely token);
    otherwise the token is drawn with ``generator`` from ``softmax(logits / temperature)``
    kept to the nucleus ``top_p``. Banned tokens (``sampling.banned_token_ids``) are never
    picked, and the log-probability is then under the distribution renormalised over the
    allowed tokens (the banned logits at ``-inf``): the distribution sampled from, which the
    actor recomputes from the rollout's ``banned_token_ids`` column."""
    logits = logits.float()
    allowed = logits
    if sampling.banned_token_ids:  # never sampled, and out of the log-prob's normaliser
        allowed = logits.clone()
        allowed[list(sampling.banned_token_ids)] = float("-inf")
    scaled = allowed / sampling.temperature if sampling.temperature > 0 else allowed
    overflow = not bool(torch.isfinite(scaled[torch.isfinite(allowed)]).all())
    if sampling.temperature == 0 or overflow:
        # greedy; also for a temperature so small that the scaled logits overflow
        token = int(allowed.argmax().item())
    else:
        kept = filter_logits(scaled, 0, sampling.top_p)
        probs = F.softmax(kept, dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator).item())
    tempered = allowed if overflow else scaled  # overflowing: the untempered distribution's
    logprob = float(F.log_softmax(tempered[None], dim=-1)[0, token].item())
    return token, logprob
