"""A URI turned into an object store and a key prefix.

obstore (Rust's ``object_store`` behind a thin Python layer) is the one library for every
scheme: ranged GETs for the per-node chunk fetch, create-only PUTs (S3 ``If-None-Match: *``,
GCS ``ifGenerationMatch=0``) for the log's write-once records, and no botocore/aiohttp stack
in every replica. Credentials and endpoints come from the standard environment variables of
each cloud (``AWS_*``, ``GOOGLE_*``), so a pod's service account or a mounted secret works
without project settings; ``AWS_ENDPOINT_URL`` points S3 at MinIO, Ceph or a test server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from morphogen.storage.settings import current

REMOTE_SCHEMES = ("s3", "gs", "http", "https")
# where write-once objects can be created (a web server serves snapshots, but has no
# conditional create for an epoch log's records)
WRITABLE_SCHEMES = ("s3", "gs")


class StorageError(RuntimeError):
    """An object store could not be reached or refused a request; the message names the URI."""


def is_remote(uri: str | os.PathLike[str]) -> bool:
    """Whether ``uri`` names an object store rather than a local path (``file://`` is local)."""
    scheme = urlsplit(str(uri)).scheme.lower()
    return scheme in REMOTE_SCHEMES


# Tabs and newlines anywhere in a URL are dropped (by urlsplit and by WHATWG URL parsing).
# For http(s), WHATWG parsing (the `url` crate under obstore's HTTP client) also reads `\` as
# `/`, and resolves a segment that is `.` or `..` once `%2e` is read as a dot.
_DROPPED = str.maketrans("", "", "\t\n\r")
_DOT = frozenset({".", "%2e"})
_DOTDOT = frozenset({"..", ".%2e", "%2e.", "%2e%2e"})


def requested_location(uri: str) -> tuple[str, str, tuple[str, ...], str]:
    """(scheme, authority, path segments, query and fragment) of `uri` as its store's client
    will request it. An http(s) URL is resolved as the HTTP client parses it (see above), so
    `http://h/snaps/%2e%2e/x` is `http://h/x`; an s3:// or gs:// key is taken literally (it
    names one object, whatever it holds). A trailing slash is left out."""
    text = uri.strip("".join(map(chr, range(33))))
    scheme, _, rest = text.partition(":")
    scheme = scheme.lower()
    web = scheme in ("http", "https")
    rest = rest.translate(_DROPPED)
    if web:
        rest = rest.replace("\\", "/")
    rest, hashmark, fragment = rest.partition("#")
    rest, qmark, query = rest.partition("?")
    authority, _, path = rest.removeprefix("//").partition("/")
    segments: list[str] = []
    for seg in path.split("/"):
        low = seg.lower()
        if web and low in _DOTDOT:
            if segments:
                segments.pop()
        elif not (web and low in _DOT):
            segments.append(seg)
    if segments and not segments[-1]:
        segments.pop()
    return scheme, authority.lower(), tuple(segments), qmark + query + hashmark + fragment


def lies_under(uri: str, prefix: str) -> bool:
    """Whether `uri`, resolved as it will be requested, names something strictly under
    `prefix`, compared segment by segment (so `/snaps2` is not under `/snaps`)."""
    scheme, authority, segments, extra = requested_location(uri)
    p_scheme, p_authority, p_segments, p_extra = requested_location(prefix)
    return ((scheme, authority, extra, p_extra) == (p_scheme, p_authority, "", "")
            and len(segments) > len(p_segments) and segments[:len(p_segments)] == p_segments)


def check_log_location(uri: str | os.PathLike[str]) -> None:
    """Refuse a URI that cannot hold an epoch log, naming what can."""
    scheme = urlsplit(str(uri)).scheme.lower()
    if scheme in REMOTE_SCHEMES and scheme not in WRITABLE_SCHEMES:
        raise ValueError(f"{uri}: an epoch log needs write-once objects (s3://, gs://) or a "
                         f"shared directory; {scheme}:// serves files but cannot create them")


def local_path(uri: str | os.PathLike[str]) -> Path:
    """The local path of a plain path or a ``file://`` URI."""
    text = str(uri)
    parts = urlsplit(text)
    if parts.scheme.lower() == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{text}: a file:// URI names a path on this node, "
                             f"not on {parts.netloc}")
        return Path(parts.path)
    if parts.scheme:
        raise ValueError(f"{text}: unsupported scheme {parts.scheme!r} (use a path, file://, "
                         f"s3://, gs:// or https://)")
    return Path(text)


@dataclass(frozen=True)
class Location:
    """An object store and the key prefix under it that a URI names.

    ``uri`` is kept as given (less a trailing slash) for messages; ``prefix`` has no leading or
    trailing slash, and ``key(name)`` joins names under it.
    """

    uri: str
    store: Any
    prefix: str

    def key(self, *names: str) -> str:
        return "/".join(p for p in (self.prefix, *names) if p)

    def child(self, name: str) -> Location:
        return Location(f"{self.uri}/{name}", self.store, self.key(name))


def _client(**extra: Any) -> dict[str, Any]:
    """The timeouts and retries of `morphogen.storage.settings`, for a store's constructor."""
    settings = current()
    return {"client_options": {**settings.client_options(), **extra},
            "retry_config": settings.retry_config()}


def _s3_store(bucket: str) -> Any:
    from obstore.store import S3Store

    config: dict[str, Any] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    client_options: dict[str, Any] = {}
    if endpoint:
        config["endpoint"] = endpoint
        if endpoint.startswith("http://"):
            client_options["allow_http"] = True
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        config["region"] = region
    # the constructor also reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, web
    # identity tokens (EKS IRSA) and the instance metadata service, in the usual order
    return S3Store(bucket, config=config or None, **_client(**client_options))


def _gcs_store(bucket: str) -> Any:
    from obstore.store import GCSStore

    return GCSStore(bucket, **_client())  # GOOGLE_* variables, or the node's service account


def _http_store(base: str) -> Any:
    from obstore.store import HTTPStore

    # plain http only where a URI says so (a cluster-internal server); https stays the default
    plain = urlsplit(base).scheme.lower() == "http"
    return HTTPStore.from_url(base, **_client(**({"allow_http": True} if plain else {})))


def open_location(uri: str | os.PathLike[str]) -> Location:
    """The object store and prefix of ``s3://bucket/prefix``, ``gs://bucket/prefix``,
    ``https://host/path`` or a local path / ``file://`` URI (a LocalStore rooted there)."""
    text = str(uri).rstrip("/") or str(uri)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    try:
        if scheme == "s3":
            if not parts.netloc:
                raise ValueError(f"{text}: no bucket (s3://BUCKET/PREFIX)")
            return Location(text, _s3_store(parts.netloc), parts.path.strip("/"))
        if scheme == "gs":
            if not parts.netloc:
                raise ValueError(f"{text}: no bucket (gs://BUCKET/PREFIX)")
            return Location(text, _gcs_store(parts.netloc), parts.path.strip("/"))
        if scheme in ("http", "https"):
            return Location(text, _http_store(text), "")
    except ValueError:
        raise
    except Exception as exc:  # obstore raises its own config errors: name the URI
        raise StorageError(f"{text}: cannot open the object store: {exc}") from exc
    from obstore.store import LocalStore

    path = local_path(text)
    return Location(text, LocalStore(path.resolve(), mkdir=True), "")
