"""Ethereum state as keyword records: three tables, one per kind, each of fixed-size values.

Accounts (value size 72)
    key    the address, 20 bytes
    value  nonce (8 bytes, big-endian) | balance (32 bytes, big-endian) | code hash (32 bytes,
           keccak-256 of the account's code; keccak-256 of no bytes, c5d24601...5d85a470, for
           an account without code)

Storage (value size 32)
    key    the address (20 bytes) | the slot (32 bytes), 52 bytes
    value  the slot's word, 32 bytes. A slot whose word is zero has no record: a lookup that
           finds nothing means zero, as the chain itself does.

Code (value size 1024)
    key    the code hash (32 bytes) | the chunk's index (4 bytes, big-endian), 36 bytes
    value  the code's total length (4 bytes, big-endian) | the chunk's bytes: code[1020 * index
           : 1020 * (index + 1)], zero-padded to 1020 bytes

Code is keyed by its hash, so contracts sharing code share its records. A reader looks up
chunk 0 of an account's code hash, learns the length from it, then the other
ceil(length / 1020) - 1 chunks, and checks the joined code against the hash. Empty code has
no records (its hash says it is empty).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from Crypto.Hash import keccak

ADDRESS_SIZE = 20
WORD_SIZE = 32
ACCOUNT_VALUE_SIZE = 8 + WORD_SIZE + WORD_SIZE
STORAGE_KEY_SIZE = ADDRESS_SIZE + WORD_SIZE
STORAGE_VALUE_SIZE = WORD_SIZE
CODE_KEY_SIZE = WORD_SIZE + 4
CODE_VALUE_SIZE = 1024
CODE_CHUNK_SIZE = CODE_VALUE_SIZE - 4
# the chunk index and the length are four bytes; the protocol caps code far lower (EIP-170,
# 24,576 bytes deployed), so this only refuses nonsense
MAX_CODE_SIZE = 2**32 - 1


def keccak256(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


EMPTY_CODE_HASH = keccak256(b"")


def _bytes_of(value: bytes | str, size: int, what: str) -> bytes:
    if isinstance(value, str):
        if value[:2] not in ("0x", "0X"):
            raise ValueError(f"{what} {value[:48]!r} is not 0x-hex")
        try:
            value = bytes.fromhex(value[2:])
        except ValueError:
            raise ValueError(f"{what} {value[:48]!r} is not valid hex") from None
    if len(value) != size:
        raise ValueError(f"{what} is {size} bytes, got {len(value)}")
    return bytes(value)


def address_bytes(address: bytes | str) -> bytes:
    """A 20-byte address from bytes or 0x-hex (any case)."""
    return _bytes_of(address, ADDRESS_SIZE, "an address")


def word_bytes(word: int | bytes | str, what: str = "a word") -> bytes:
    """A 32-byte word (a slot or its value) from an int, 32 bytes, or 0x-hex of at most 32
    bytes (a quantity such as "0x1" is widened)."""
    if isinstance(word, str):
        if word[:2] not in ("0x", "0X") or len(word) > 2 + 2 * WORD_SIZE:
            raise ValueError(f"{what} {word[:72]!r} is not 0x-hex of at most 32 bytes")
        try:
            word = int(word, 16)
        except ValueError:
            raise ValueError(f"{what} {word[:72]!r} is not valid hex") from None
    if isinstance(word, int) and not isinstance(word, bool):
        if not 0 <= word < 2**256:
            raise ValueError(f"{what} must be in [0, 2**256)")
        return word.to_bytes(WORD_SIZE, "big")
    return _bytes_of(word, WORD_SIZE, what)


# -- accounts ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Account:
    nonce: int
    balance: int  # wei
    code_hash: bytes = EMPTY_CODE_HASH

    def __post_init__(self) -> None:
        if not 0 <= self.nonce < 2**64:
            raise ValueError(f"a nonce is in [0, 2**64), got {self.nonce}")
        if not 0 <= self.balance < 2**256:
            raise ValueError("a balance is in [0, 2**256)")
        if len(self.code_hash) != WORD_SIZE:
            raise ValueError(f"a code hash is 32 bytes, got {len(self.code_hash)}")

    @property
    def has_code(self) -> bool:
        return self.code_hash != EMPTY_CODE_HASH


def encode_account(account: Account) -> bytes:
    return (account.nonce.to_bytes(8, "big") + account.balance.to_bytes(WORD_SIZE, "big")
            + account.code_hash)


def decode_account(value: bytes) -> Account:
    if len(value) != ACCOUNT_VALUE_SIZE:
        raise ValueError(f"an account value is {ACCOUNT_VALUE_SIZE} bytes, got {len(value)}")
    return Account(int.from_bytes(value[:8], "big"), int.from_bytes(value[8:40], "big"),
                   bytes(value[40:]))


def account_record(address: bytes | str, account: Account) -> tuple[bytes, bytes]:
    return address_bytes(address), encode_account(account)


# -- storage -----------------------------------------------------------------------------------

def storage_key(address: bytes | str, slot: int | bytes | str) -> bytes:
    return address_bytes(address) + word_bytes(slot, "a slot")


def split_storage_key(key: bytes) -> tuple[bytes, bytes]:
    """(address, slot) of a storage key."""
    if len(key) != STORAGE_KEY_SIZE:
        raise ValueError(f"a storage key is {STORAGE_KEY_SIZE} bytes, got {len(key)}")
    return bytes(key[:ADDRESS_SIZE]), bytes(key[ADDRESS_SIZE:])


def storage_records(address: bytes | str, storage: Mapping[int | bytes | str, int | bytes | str]
                    ) -> Iterator[tuple[bytes, bytes]]:
    """The records of one account's storage, zero words left out, in slot order."""
    address = address_bytes(address)
    words = sorted((word_bytes(s, "a slot"), word_bytes(v, "a storage value"))
                   for s, v in storage.items())
    for slot, value in words:
        if any(value):
            yield address + slot, value


def decode_storage_value(value: bytes | None) -> int:
    """The word of a storage lookup; None (no record) is zero."""
    if value is None:
        return 0
    if len(value) != STORAGE_VALUE_SIZE:
        raise ValueError(f"a storage value is {STORAGE_VALUE_SIZE} bytes, got {len(value)}")
    return int.from_bytes(value, "big")


# -- code --------------------------------------------------------------------------------------

def code_key(code_hash: bytes, index: int) -> bytes:
    if len(code_hash) != WORD_SIZE:
        raise ValueError(f"a code hash is 32 bytes, got {len(code_hash)}")
    if not 0 <= index < 2**32:
        raise ValueError(f"a chunk index is in [0, 2**32), got {index}")
    return bytes(code_hash) + index.to_bytes(4, "big")


def code_chunks(length: int) -> int:
    """How many records code of `length` bytes takes."""
    return -(-length // CODE_CHUNK_SIZE)


def code_records(code: bytes) -> list[tuple[bytes, bytes]]:
    """The records of one piece of code under its hash; none for empty code."""
    if len(code) > MAX_CODE_SIZE:
        raise ValueError(f"code of {len(code)} bytes does not fit a 4-byte length")
    code_hash = keccak256(code)
    head = len(code).to_bytes(4, "big")
    out = []
    for i in range(code_chunks(len(code))):
        chunk = code[i * CODE_CHUNK_SIZE:(i + 1) * CODE_CHUNK_SIZE]
        out.append((code_key(code_hash, i), head + chunk.ljust(CODE_CHUNK_SIZE, b"\0")))
    return out


def code_length(first_chunk: bytes) -> int:
    """The total code length a chunk value states (every chunk states it)."""
    if len(first_chunk) != CODE_VALUE_SIZE:
        raise ValueError(f"a code value is {CODE_VALUE_SIZE} bytes, got {len(first_chunk)}")
    return int.from_bytes(first_chunk[:4], "big")


def join_code(code_hash: bytes, chunks: Sequence[bytes]) -> bytes:
    """The code from its chunk values in index order, checked: every chunk states the same
    length, there are as many as it needs, the padding is zero, and the code hashes to
    `code_hash`. ValueError says which check failed."""
    if code_hash == EMPTY_CODE_HASH:
        if chunks:
            raise ValueError("empty code has no chunks")
        return b""
    if not chunks:
        raise ValueError("code with a hash other than the empty code's needs its chunks")
    length = code_length(chunks[0])
    if len(chunks) != code_chunks(length):
        raise ValueError(f"code of {length} bytes is {code_chunks(length)} chunks, got "
                         f"{len(chunks)}")
    parts = []
    for i, value in enumerate(chunks):
        if code_length(value) != length:
            raise ValueError(f"chunk {i} states length {code_length(value)}, chunk 0 {length}")
        used = min(CODE_CHUNK_SIZE, length - i * CODE_CHUNK_SIZE)
        if any(value[4 + used:]):
            raise ValueError(f"chunk {i} has bytes past the code's end")
        parts.append(value[4:4 + used])
    code = b"".join(parts)
    if keccak256(code) != code_hash:
        raise ValueError("the joined code does not hash to its code hash")
    return code
