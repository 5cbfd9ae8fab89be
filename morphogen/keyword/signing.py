"""The data owner's Ed25519 key and the exact bytes its one signature a version covers.

The owner signs a version's descriptor only (domain-separated); the descriptor names the root
of the hash tree that proves every page (`morphogen.keyword.tree`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from morphogen.storage.durable import fsync_dir, write_atomic

DESCRIPTOR_DOMAIN = b"morphogen-keyword-descriptor-v2\0"
DATASET_SIZE = 16
SIGNATURE_SIZE = 64


def descriptor_message(body: bytes | memoryview) -> bytes:
    return DESCRIPTOR_DOMAIN + bytes(body)


def public_bytes(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def load_public_key(source: str | os.PathLike[str] | bytes) -> Ed25519PublicKey:
    """A public key from 32 raw bytes, 64 hex digits, or a file holding the hex."""
    if isinstance(source, bytes) and len(source) == 32:
        return Ed25519PublicKey.from_public_bytes(source)
    text = source.decode() if isinstance(source, bytes) else str(source)
    if not _is_hex_key(text):
        path = Path(text)
        if not path.is_file():
            raise ValueError(f"{text}: neither 64 hex digits of an Ed25519 public key nor a "
                             "file holding them")
        text = path.read_text().strip()
        if not _is_hex_key(text):
            raise ValueError(f"{source}: does not hold 64 hex digits of an Ed25519 public key")
    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text.strip()))


def _is_hex_key(text: str) -> bool:
    text = text.strip()
    return len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text)


def generate_key_files(private_path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """A new signing key at `private_path` (hex, mode 0600, never overwritten) and its public
    key beside it (`.pub`). Returns both paths.

    Each file is whole and durable before this returns: the key is written under a temporary
    name, synced, and linked to its name, which fails where a key is already (an existing key
    is the owner's identity; replacing it would orphan every table). A crash between the two
    files leaves the key without its `.pub`: a second call writes that key's `.pub`, then
    refuses as for any existing key."""
    private_path = Path(private_path)
    public_path = private_path.with_suffix(".pub")
    if private_path.exists():
        if not public_path.exists():
            _write_public(public_path, load_signing_key(private_path))
        raise FileExistsError(private_path)
    key = Ed25519PrivateKey.generate()
    tmp = private_path.with_name(f".{private_path.name}.tmp-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(key.private_bytes_raw().hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, private_path)  # FileExistsError where another call won meanwhile
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(private_path.parent)
    _write_public(public_path, key)
    return private_path, public_path


def _write_public(path: Path, key: Ed25519PrivateKey) -> None:
    write_atomic(path, (public_bytes(key.public_key()).hex() + "\n").encode())


def load_signing_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    text = Path(path).read_text().strip()
    if not _is_hex_key(text):
        raise ValueError(f"{path}: does not hold 64 hex digits of an Ed25519 signing key")
    return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(text))


def verify(key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    try:
        key.verify(signature, message)
    except InvalidSignature:
        return False
    return True
