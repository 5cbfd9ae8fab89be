"""What went wrong with an object store, in one line an operator can act on.

The store library's errors are many lines (a message, then a debug dump of the request); what
matters is the kind (missing, refused credentials, no answer in time, unreachable) and the
request's own line. `StoreFailure` carries both; `ride_out` retries an opening while the
store is unreachable, up to the configured outage.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from typing import TypeVar

from morphogen.storage.location import StorageError
from morphogen.storage.settings import current
from morphogen.storage.store_errors import short_reason

log = logging.getLogger(__name__)
T = TypeVar("T")

MISSING, DENIED, TIMEOUT, UNREACHABLE, OTHER = (
    "missing", "denied", "timeout", "unreachable", "error")

HINTS = {
    MISSING: "no such object: check the URI",
    DENIED: "the store refused the credentials: check AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY (or the pod's service account) and the bucket's policy",
    TIMEOUT: "the store took the connection but did not answer in time (hung or overloaded): "
             "check it and AWS_ENDPOINT_URL; store_timeout_s sets the wait",
    UNREACHABLE: "the store could not be reached: check AWS_ENDPOINT_URL, the network and "
                 "whether the store is up; store_outage_s sets how long starts wait for it",
    OTHER: "",
}


class StoreFailure(StorageError):
    """A store request failed; `kind` says how, the message is one line with a hint."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def transient(self) -> bool:
        """Whether trying again later may succeed (the store is down, not wrong)."""
        return self.kind in (UNREACHABLE, OTHER)


def kind_of(exc: BaseException) -> str:
    """How a store request failed, from its exception (type first, then the library's
    debug text, which names the transport error)."""
    name = type(exc).__name__
    text = str(exc)
    if isinstance(exc, FileNotFoundError) or name == "NotFoundError":
        return MISSING
    if name in ("PermissionDeniedError", "UnauthenticatedError") or isinstance(
            exc, PermissionError):
        return DENIED
    if "kind: Timeout" in text or "TimedOut" in text or "timed out" in text.lower():
        return TIMEOUT
    if ("kind: Connect" in text or "ConnectionRefused" in text or "error sending request"
            in text or "dns error" in text.lower()):
        return UNREACHABLE
    if re.search(r"\b(403|401)\b.*(Forbidden|Unauthorized|AccessDenied|SignatureDoesNotMatch"
                 r"|InvalidAccessKeyId)", text):
        return DENIED
    return OTHER


def failure(what: str, exc: BaseException) -> StoreFailure:
    """`exc`, raised by a request for `what` (a URI), as one line naming it, with a hint."""
    if isinstance(exc, StoreFailure):
        return exc
    kind = kind_of(exc)
    hint = HINTS[kind]
    return StoreFailure(f"{what}: {short_reason(exc)}" + (f" ({hint})" if hint else ""), kind)


def retryable(what: str, exc: BaseException) -> tuple[BaseException, bool]:
    """(what to raise for `exc`, whether it may pass if tried again): a store library's error
    becomes a one-line `StoreFailure`; an error of a layer above that says whether it is
    transient (the epoch log's) is kept; anything else is no store failure and not retried."""
    if isinstance(exc, StoreFailure) or type(exc).__module__.startswith("obstore"):
        err = failure(what, exc)
        return err, err.transient
    return exc, bool(getattr(exc, "transient", False))


def ride_out(fn: Callable[[], T], what: str, *, outage_s: float | None = None,
             sleep: Callable[[float], None] = time.sleep) -> T:
    """`fn()`, tried again while the store is unreachable, until `outage_s` (the configured
    one by default) has passed since the first failure. A hung store (timeouts), a missing
    object or refused credentials fail at once: waiting would not change them."""
    window = current().outage_s if outage_s is None else outage_s
    first: float | None = None
    delay = 1.0
    while True:
        try:
            return fn()
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified below, re-raised as one line
            err, transient = retryable(what, exc)
            now = time.monotonic()
            first = now if first is None else first
            if not transient or now - first >= window:
                if err is exc:
                    raise
                raise err from None
            log.warning("%s; trying again (%.0f of %.0f s)", err, now - first, window)
            sleep(min(delay, max(0.0, first + window - now)) * random.uniform(0.8, 1.2))
            delay = min(delay * 2, 10.0)
