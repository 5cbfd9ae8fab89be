"""JSON-RPC 2.0 over the private methods: requests, batches, errors, and the upstream node.

`Endpoint.handle(body)` takes an HTTP body and gives the body to answer (None: nothing, for
notifications only). Every failure is a JSON-RPC error with an integer code, never an
exception out of here and never a guess:

  -32700  the body is not JSON
  -32600  not a request object (or an empty batch)
  -32601  a method this endpoint neither answers nor forwards (no --upstream), named
  -32602  params that do not fit the method (an address, a slot, a block)
  -32001  a block other than the one served, without an upstream
  -32002  no verified, fresh answer: the parties are unreachable, an answer did not verify
          against the owner's signed root, or the served block is older than the bounds
  -32002  also: eth_call / eth_estimateGas past its EVM time, and any request of a request given
          up (its client gone, or past its deadline): "request timed out", as geth answers
  -32005  a batch over `max_batch` requests; a call over the per-call limits on reads/rounds
       3  eth_call / eth_estimateGas reverted (data: the revert data), as geth answers
  -32000  eth_call / eth_estimateGas halted (out of gas, an invalid opcode)
  -32603  anything else (a bug), the method named, nothing of the request

Requests that are not answered privately (other methods, other blocks) go to the upstream node
when one is configured, one request at a time, as they came. No address, slot or answer is ever
logged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

from morphogen.chain.state import address_bytes
from morphogen.client import PirError
from morphogen.keyword import KeywordIntegrityError, StaleTableError, TableChangingError
from morphogen.protocol.nesting import json_nesting
from morphogen.wallet.call_errors import CallFailed, CallLimit
from morphogen.wallet.methods import METHODS, InvalidParams, NotServed
from morphogen.wallet.sent import SentNonces, learn
from morphogen.wallet.state import PrivateState
from morphogen.wallet.workers import (
    Cancelled,
    RunTimedOut,
    client,
    current_client,
    current_request,
)

log = logging.getLogger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
NOT_SERVED = -32001
UNAVAILABLE = -32002
LIMIT_EXCEEDED = -32005
TIMED_OUT = -32002  # geth's code for a request past its time, and no answer: retry later
EXECUTION_REVERTED = 3  # geth's code for a reverted eth_call / eth_estimateGas
CALL_HALTED = -32000  # a call that halted (out of gas, invalid opcode)
MAX_BATCH = 100
# Nesting a request may have: a call's access list is 4 deep inside a batch; more is refused
# before anything walks it (the standard library's JSON recurses).
MAX_DEPTH = 32

# forwards one request object to the upstream node and returns its response object
Forward = Callable[[dict], dict]


CALL_METHODS = ("eth_call", "eth_estimateGas")
BATCH_THREADS = 32  # a batch's requests run this many at once, on threads of its own


def error(rid: Any, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


class Endpoint:
    def __init__(self, state: PrivateState, *, forward: Forward | None = None,
                 calls: Any = None, max_batch: int = MAX_BATCH) -> None:
        """`calls`: a `PrivateCalls` for eth_call and eth_estimateGas (else they are
        forwarded or refused like any method not answered here)."""
        if max_batch < 1:
            raise ValueError("max_batch is at least 1")
        self.state, self.forward, self.max_batch = state, forward, max_batch
        self.methods = dict(METHODS)
        # `pending` counts the transactions sent through here (wallet/sent.py)
        self.sent = SentNonces()
        self.methods["eth_getTransactionCount"] = self._transaction_count
        self.calls = calls
        if calls is not None:
            self.methods["eth_call"] = lambda state, params: calls.eth_call(params)
            self.methods["eth_estimateGas"] = lambda state, params: calls.eth_estimate_gas(params)

    def handle(self, body: bytes) -> bytes | None:
        # Before parsing: the parser recurses in C once a level, and where the process's
        # recursion limit has been raised a deep enough body overflows the stack.
        if json_nesting(body) > MAX_DEPTH:
            return _dump(error(None, INVALID_REQUEST, f"the body nests deeper than {MAX_DEPTH}"))
        try:
            request = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return _dump(error(None, PARSE_ERROR, "the body is not JSON"))
        if isinstance(request, list):
            if not request:
                return _dump(error(None, INVALID_REQUEST, "an empty batch"))
            if len(request) > self.max_batch:
                return _dump(error(None, LIMIT_EXCEEDED, f"a batch of {len(request)} requests "
                                   f"is over this endpoint's limit of {self.max_batch}"))
            # at once: the calls of a batch share their private rounds (wallet/rounds.py)
            announced = sum(isinstance(r, dict) and r.get("method") in CALL_METHODS
                            for r in request)
            # on threads of this batch's own: a batch never waits behind another
            # connection's (and its runs are queued as its connection's: workers.py)
            key, given = current_client(), current_request()

            def one(r: Any) -> dict | None:
                with client(key, given):
                    return self.one(r)

            with (nullcontext() if self.calls is None
                  else self.calls.rounds.expecting(announced)), \
                    ThreadPoolExecutor(min(len(request), BATCH_THREADS),
                                       thread_name_prefix="morphogen-rpc-batch") as pool:
                answers = [a for a in pool.map(one, request) if a is not None]
            return _dump(answers) if answers else None
        answer = self.one(request)
        return None if answer is None else _dump(answer)

    def one(self, request: Any) -> dict | None:
        """The response object of one request (None for a notification)."""
        if not isinstance(request, dict):
            return error(None, INVALID_REQUEST, "a request is a JSON object")
        rid = request.get("id")
        if not isinstance(rid, (str, int, type(None))) or isinstance(rid, bool):
            return error(None, INVALID_REQUEST, "id must be a string, a number or null")
        method, params = request.get("method"), request.get("params", [])
        if request.get("jsonrpc") != "2.0" or not isinstance(method, str):
            return error(rid, INVALID_REQUEST, 'a request has "jsonrpc": "2.0" and a method')
        given = current_request()
        why = given.given_up() if given is not None else None
        if why is not None:  # nothing more is done for a request given up
            answer = error(rid, TIMED_OUT, f"{method[:64]}: request timed out ({why})")
        else:
            answer = self._answer(rid, method, params, request)
        return answer if "id" in request else None

    def _answer(self, rid: Any, method: str, params: Any, request: dict) -> dict:
        handler = self.methods.get(method)
        try:
            if handler is None:
                raise NotServed(f"{method[:64]} is not answered privately")
            if not isinstance(params, list):
                raise InvalidParams(f"{method} takes positional params (a JSON array)")
            return {"jsonrpc": "2.0", "id": rid, "result": handler(self.state, params)}
        except NotServed as exc:
            if self.forward is not None:
                return self._forwarded(rid, method, request)
            code = METHOD_NOT_FOUND if handler is None else NOT_SERVED
            return error(rid, code, f"{exc}, and no --upstream node is set to send it to")
        except InvalidParams as exc:
            return error(rid, INVALID_PARAMS, f"{method}: {exc}")
        except CallFailed as exc:  # as a node answers a reverted call: code 3 and its data
            if exc.reason.startswith("Revert"):
                return {"jsonrpc": "2.0", "id": rid, "error": {
                    "code": EXECUTION_REVERTED, "message": "execution reverted",
                    "data": "0x" + exc.data.hex()}}
            return error(rid, CALL_HALTED, f"{method}: the call failed: {exc.reason[:200]}")
        except CallLimit as exc:
            return error(rid, LIMIT_EXCEEDED, f"{method}: over this endpoint's limits: {exc} "
                         "(docs/wallet.md)")
        except (RunTimedOut, Cancelled) as exc:  # as geth answers a call past its timeout
            return error(rid, TIMED_OUT, f"{method}: request timed out: {exc}")
        except StaleTableError as exc:
            return error(rid, UNAVAILABLE, f"{method}: stale state: {exc}")
        except (KeywordIntegrityError, TableChangingError) as exc:
            return error(rid, UNAVAILABLE, f"{method}: no verified answer: {exc}")
        except PirError as exc:
            return error(rid, UNAVAILABLE, f"{method}: the parties did not answer: {exc}")
        except Exception as exc:  # a bug: say so without the request's contents
            log.error("%s failed: %s", method, type(exc).__name__)
            return error(rid, INTERNAL_ERROR, f"{method}: internal error "
                         f"({type(exc).__name__})")

    def _forwarded(self, rid: Any, method: str, request: dict) -> dict:
        assert self.forward is not None
        try:
            answer = self.forward(request)
        except Exception as exc:
            return error(rid, UNAVAILABLE, f"{method}: the upstream node did not answer "
                         f"({type(exc).__name__})")
        if not isinstance(answer, dict):
            return error(rid, UNAVAILABLE, f"{method}: the upstream node's answer is not a "
                         "JSON-RPC response")
        if method == "eth_sendRawTransaction" and "result" in answer:
            learn(self.sent, self.forward, answer["result"])
        return answer

    def _transaction_count(self, state: PrivateState, params: list) -> str:
        signed = METHODS["eth_getTransactionCount"](state, params)
        if len(params) < 2 or params[1] != "pending":
            return signed
        return hex(self.sent.pending(address_bytes(params[0]), int(signed, 16)))


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
