"""XXH3 64-bit (default secret), in pure Python.

Routing needs it twice (docs/protocol.md): the row-affinity rendezvous hash (§9,
`XXH3_64(R)` and `XXH3_64_withSeed(K, seed)`) and the deployment digest (§11,
XXH3-64 of the topology text, a 0x00 byte and the placement text). Written from
the XXH3 specification (xxHash 0.8, `xxhash.h`); the tests check it against the
`xxhash` package at every length class.
"""

from __future__ import annotations

import struct

_M64 = (1 << 64) - 1

_P32_1 = 0x9E3779B1
_P32_2 = 0x85EBCA77
_P32_3 = 0xC2B2AE3D
_P64_1 = 0x9E3779B185EBCA87
_P64_2 = 0xC2B2AE3D27D4EB4F
_P64_3 = 0x165667B19E3779F9
_P64_4 = 0x85EBCA77C2B2AE63
_P64_5 = 0x27D4EB2F165667C5
_PMX1 = 0x165667919E3779F9
_PMX2 = 0x9FB21C651E98DF25

_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
_STRIPE = 64
_ACC_NB = 8
_CONSUME_RATE = 8

_u64 = struct.Struct("<Q").unpack_from
_u32 = struct.Struct("<I").unpack_from


def _r64(b: bytes, i: int) -> int:
    return _u64(b, i)[0]


def _r32(b: bytes, i: int) -> int:
    return _u32(b, i)[0]


def _rotl64(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _swap32(x: int) -> int:
    return int.from_bytes(x.to_bytes(4, "little"), "big")


def _swap64(x: int) -> int:
    return int.from_bytes(x.to_bytes(8, "little"), "big")


def _mul128_fold64(a: int, b: int) -> int:
    p = a * b
    return (p ^ (p >> 64)) & _M64


def _xxh64_avalanche(h: int) -> int:
    h ^= h >> 33
    h = (h * _P64_2) & _M64
    h ^= h >> 29
    h = (h * _P64_3) & _M64
    return h ^ (h >> 32)


def _avalanche(h: int) -> int:
    h ^= h >> 37
    h = (h * _PMX1) & _M64
    return h ^ (h >> 32)


def _rrmxmx(h: int, n: int) -> int:
    h ^= _rotl64(h, 49) ^ _rotl64(h, 24)
    h = (h * _PMX2) & _M64
    h ^= (h >> 35) + n
    h = (h * _PMX2) & _M64
    return h ^ (h >> 28)


def _mix16(data: bytes, i: int, secret: bytes, s: int, seed: int) -> int:
    lo = _r64(data, i)
    hi = _r64(data, i + 8)
    return _mul128_fold64(
        lo ^ ((_r64(secret, s) + seed) & _M64),
        hi ^ ((_r64(secret, s + 8) - seed) & _M64),
    )


def _len_0to16(data: bytes, seed: int) -> int:
    n = len(data)
    s = _SECRET
    if n > 8:
        bitflip1 = ((_r64(s, 24) ^ _r64(s, 32)) + seed) & _M64
        bitflip2 = ((_r64(s, 40) ^ _r64(s, 48)) - seed) & _M64
        lo = _r64(data, 0) ^ bitflip1
        hi = _r64(data, n - 8) ^ bitflip2
        acc = (n + _swap64(lo) + hi + _mul128_fold64(lo, hi)) & _M64
        return _avalanche(acc)
    if n >= 4:
        seed ^= _swap32(seed & 0xFFFFFFFF) << 32
        in1 = _r32(data, 0)
        in2 = _r32(data, n - 4)
        bitflip = ((_r64(s, 8) ^ _r64(s, 16)) - seed) & _M64
        keyed = ((in2 + (in1 << 32)) & _M64) ^ bitflip
        return _rrmxmx(keyed, n)
    if n > 0:
        combined = (data[0] << 16) | (data[n >> 1] << 24) | data[n - 1] | (n << 8)
        bitflip = ((_r32(s, 0) ^ _r32(s, 4)) + seed) & _M64
        return _xxh64_avalanche(combined ^ bitflip)
    return _xxh64_avalanche(seed ^ _r64(s, 56) ^ _r64(s, 64))


def _len_17to128(data: bytes, seed: int) -> int:
    n = len(data)
    acc = (n * _P64_1) & _M64
    if n > 32:
        if n > 64:
            if n > 96:
                acc += _mix16(data, 48, _SECRET, 96, seed)
                acc += _mix16(data, n - 64, _SECRET, 112, seed)
            acc += _mix16(data, 32, _SECRET, 64, seed)
            acc += _mix16(data, n - 48, _SECRET, 80, seed)
        acc += _mix16(data, 16, _SECRET, 32, seed)
        acc += _mix16(data, n - 32, _SECRET, 48, seed)
    acc += _mix16(data, 0, _SECRET, 0, seed)
    acc += _mix16(data, n - 16, _SECRET, 16, seed)
    return _avalanche(acc & _M64)


def _len_129to240(data: bytes, seed: int) -> int:
    n = len(data)
    acc = (n * _P64_1) & _M64
    for i in range(8):
        acc += _mix16(data, 16 * i, _SECRET, 16 * i, seed)
    acc = _avalanche(acc & _M64)
    for i in range(8, n // 16):
        acc += _mix16(data, 16 * i, _SECRET, 16 * (i - 8) + 3, seed)
    acc += _mix16(data, n - 16, _SECRET, 136 - 17, seed)
    return _avalanche(acc & _M64)


def _accumulate_512(acc: list[int], data: bytes, i: int, secret: bytes, s: int) -> None:
    for j in range(_ACC_NB):
        v = _r64(data, i + 8 * j)
        k = v ^ _r64(secret, s + 8 * j)
        acc[j ^ 1] = (acc[j ^ 1] + v) & _M64
        acc[j] = (acc[j] + (k & 0xFFFFFFFF) * (k >> 32)) & _M64


def _scramble(acc: list[int], secret: bytes, s: int) -> None:
    for j in range(_ACC_NB):
        a = acc[j]
        a ^= a >> 47
        a ^= _r64(secret, s + 8 * j)
        acc[j] = (a * _P32_1) & _M64


def _long(data: bytes, seed: int) -> int:
    secret = _SECRET
    if seed:
        parts = []
        for i in range(len(_SECRET) // 16):
            parts.append(struct.pack("<QQ", (_r64(_SECRET, 16 * i) + seed) & _M64, (_r64(_SECRET, 16 * i + 8) - seed) & _M64))
        secret = b"".join(parts)
    n = len(data)
    acc = [_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1]
    stripes_per_block = (len(secret) - _STRIPE) // _CONSUME_RATE
    block = _STRIPE * stripes_per_block
    blocks = (n - 1) // block
    for b in range(blocks):
        for st in range(stripes_per_block):
            _accumulate_512(acc, data, b * block + st * _STRIPE, secret, st * _CONSUME_RATE)
        _scramble(acc, secret, len(secret) - _STRIPE)
    stripes = ((n - 1) - block * blocks) // _STRIPE
    for st in range(stripes):
        _accumulate_512(acc, data, blocks * block + st * _STRIPE, secret, st * _CONSUME_RATE)
    _accumulate_512(acc, data, n - _STRIPE, secret, len(secret) - _STRIPE - 7)
    result = (n * _P64_1) & _M64
    for i in range(4):
        result += _mul128_fold64(acc[2 * i] ^ _r64(secret, 11 + 16 * i), acc[2 * i + 1] ^ _r64(secret, 11 + 16 * i + 8))
    return _avalanche(result & _M64)


def xxh3_64(data: bytes, seed: int = 0) -> int:
    """XXH3 64-bit of `data` with `seed` (default secret)."""
    seed &= _M64
    n = len(data)
    if n <= 16:
        return _len_0to16(data, seed)
    if n <= 128:
        return _len_17to128(data, seed)
    if n <= 240:
        return _len_129to240(data, seed)
    return _long(data, seed)
