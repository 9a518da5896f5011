"""Pipelined JetStream publishes: many messages in flight, each acknowledged.

A JetStream publish is a request: the server answers on the reply subject with a
PubAck (or an error). nats-py's ``js.publish`` makes one request at a time per call,
each with its own timer and inbox wait; for a 10,000-trial submission that cost most
of the submit. Its ``publish_async`` pipelines, but (nats-py 2.16) a refusal raises
inside its reply callback and leaves the message's future unresolved, so a message the
server refused looks like one never answered. This module sends with reply subjects
on one subscription of its own and resolves each message from its answer: a PubAck
(new or duplicate), an error (raised, as nats-py's APIError), or no stream listening
(503 no responders) and silence (both: send again).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.js.errors import APIError

NO_RESPONDERS = "503"


class _Round:
    """One send of some messages: their answers by reply token."""

    def __init__(self, results: list[bool]) -> None:
        self.results = results
        self.waiting: dict[str, asyncio.Future[bool]] = {}
        self.left: list[int] = []

    async def on_reply(self, msg: Msg) -> None:
        future = self.waiting.get(msg.subject.rsplit(".", 1)[-1])
        if future is None or future.done():
            return
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
            future.set_exception(NoRespondersError())
            return
        try:
            answer = json.loads(msg.data)
        except ValueError:
            future.set_exception(APIError(description=f"unreadable PubAck: {msg.data[:80]!r}"))
            return
        error = answer.get("error") if isinstance(answer, dict) else None
        if error is not None:
            future.set_exception(
                APIError(
                    code=error.get("code"),
                    err_code=error.get("err_code"),
                    description=error.get("description"),
                )
            )
            return
        future.set_result(bool(answer.get("duplicate", False)))


async def publish_round(
    nc: NatsClient,
    items: Sequence[tuple[str, bytes, str]],
    todo: list[int],
    results: list[bool],
    *,
    window: int,
    timeout_s: float,
) -> list[int]:
    """Send ``items[i]`` for each ``i`` in ``todo`` once (subject, data, msg id), at most
    ``window`` unanswered; fill ``results[i]`` (True: new, False: duplicate) and return
    the indexes left without an answer (none for ``timeout_s``, or no stream listened).

    Raises APIError, once every sent message is settled or abandoned, when the server
    refused one (e.g. too large for its stream).
    """
    round_ = _Round(results)
    slots = asyncio.Semaphore(window)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(f"{inbox}.*", cb=round_.on_reply)
    refused: list[BaseException] = []
    try:
        for i in todo:
            if slots.locked():  # a free slot is taken without a timer
                try:
                    await asyncio.wait_for(slots.acquire(), timeout_s)
                except TimeoutError:
                    round_.left.append(i)  # answers stalled: the rest go next round
                    continue
            else:
                await slots.acquire()
            future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            future.add_done_callback(_settle(round_, i, slots, refused))
            round_.waiting[str(i)] = future
            subject, data, msg_id = items[i]
            await nc.publish(subject, data, reply=f"{inbox}.{i}", headers={"Nats-Msg-Id": msg_id})
        pending = {f for f in round_.waiting.values() if not f.done()}
        while pending:
            finished, pending = await asyncio.wait(pending, timeout=timeout_s)
            if not finished:  # no answer for timeout_s: the rest go next round
                for future in pending:
                    future.cancel()
                break
    finally:
        await sub.unsubscribe()
    if refused:
        raise refused[0]
    return sorted(round_.left)


def _settle(
    round_: _Round, i: int, slots: asyncio.Semaphore, refused: list[BaseException]
) -> Callable[[asyncio.Future[bool]], None]:
    def done(future: asyncio.Future[bool]) -> None:
        slots.release()
        if future.cancelled():
            round_.left.append(i)
            return
        exc = future.exception()
        if isinstance(exc, NoRespondersError):
            round_.left.append(i)
        elif exc is not None:
            refused.append(exc)
        else:
            round_.results[i] = not future.result()

    return done
