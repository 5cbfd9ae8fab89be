"""A real S3 protocol server on loopback (moto's server mode) for the object-storage tests.

moto's server answers the S3 REST API over HTTP, conditional writes (``If-None-Match: *``)
included, so the code under test talks to it exactly as to S3. Each test gets its own bucket;
the server runs once per test session, in a thread of the test process.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_buckets = itertools.count()


@dataclass
class S3Server:
    endpoint: str
    _server: object

    def env(self) -> dict[str, str]:
        """The environment a process (a Ray worker, the CLI) needs to reach this server."""
        return {**_CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def boto(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, **{
            "aws_access_key_id": _CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": _CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "region_name": _CREDENTIALS["AWS_REGION"],
        })

    def new_bucket(self, stem: str = "test") -> str:
        name = f"{stem}-{os.getpid()}-{next(_buckets)}"
        self.boto().create_bucket(Bucket=name)
        return name


def _atomic_creates() -> None:
    """S3 decides a create-only PUT (``If-None-Match: *``) atomically. moto checks that the key
    is absent, then writes, in whichever of its server threads: two concurrent creates of one
    key both succeed now and then, the second overwriting the first. The epoch log's lock is
    that create, so its writers would each believe they won. PUTs are serialized here."""
    from moto.s3.responses import S3Response

    real = S3Response.put_object
    if getattr(real, "serialized", False):
        return
    lock = threading.Lock()

    def put_object(self):  # type: ignore[no-untyped-def]
        with lock:
            return real(self)

    put_object.serialized = True  # type: ignore[attr-defined]
    S3Response.put_object = put_object  # type: ignore[method-assign]


@contextmanager
def running_s3_server() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    _atomic_creates()
    # one line per request otherwise, in every log a test captures
    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(f"http://{host}:{port}", server)
    finally:
        server.stop()
