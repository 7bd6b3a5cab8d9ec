"""A queue's replay window and replica count, checked once.

A queue's connection options, checked once for both queue classes: how long the server
remembers an enqueue for its resends, and how many replicas every write waits for."""

from __future__ import annotations

from echomq.client.connect import parse_url
from echomq.errors import InvalidArgument
from echomq.protocol import kernel as _k

# A resend of an enqueue whose reply was lost comes at most retry_for after the failure that
# revealed the loss, which comes at most a socket timeout (30 s on echomq's clients) after
# the send: the server keeps the call's replay marker that long, plus slack.
_REPLAY_SLACK_S = 60


def replay_ms(retry_for: float) -> int:
    """How long the server remembers an enqueue for its resends (0: it is never resent)."""
    if not retry_for > 0:
        return 0
    return int(min((retry_for + _REPLAY_SLACK_S) * 1000, _k.MAX_MS))


def durable_replicas(url: str | None, durable: int | bool | None) -> int:
    """The replicas every write waits for: ``durable`` when given, else the URL's
    ``durable=`` option; a queue on a caller's client has no URL, so 0."""
    if durable is None:
        return parse_url(url)[2] if url else 0
    if isinstance(durable, bool):
        return int(durable)
    if not isinstance(durable, int) or durable < 0:
        raise InvalidArgument(f"durable must be a replica count >= 0, got {durable!r}")
    return durable
