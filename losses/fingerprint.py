"""A fingerprint of a model's weights, computed where the weights are.

TRL's `hash_module` copies every tensor to the CPU as float32 and hashes the bytes: 33 GB and about a minute for a
7B model on a GPU, once per trainer. Here a CPU tensor's own bytes are hashed as they are (no float32 copy), and an
accelerator's tensor is reduced where it is to a position-weighted sum of its bytes (mod 2^64, with odd weights,
so changing any single byte always changes the sum); only the names, dtypes, shapes and digests meet on the CPU.
"""

from __future__ import annotations

import hashlib

import torch

_CHUNK_BYTES = 1 << 24
_MULTIPLIER = 0x9E3779B97F4A7C15 - (1 << 64)  # 64-bit golden ratio as a signed int64 (odd)


def weighted_byte_sum(data: torch.Tensor) -> int:
    """sum_i byte_i * w_i mod 2^64 over a uint8 tensor, w_i = 2 * (i * M) + 1 (odd), computed on its device."""
    total = torch.zeros((), dtype=torch.int64, device=data.device)
    for start in range(0, data.numel(), _CHUNK_BYTES):
        chunk = data[start:start + _CHUNK_BYTES].to(torch.int64)
        # int64 arithmetic wraps around, i.e. everything here is mod 2^64 (and so independent of summation order)
        weights = torch.arange(start, start + chunk.numel(), dtype=torch.int64, device=data.device)
        total += (chunk * ((weights * _MULTIPLIER) * 2 + 1)).sum()
    return int(total.item()) & (2**64 - 1)


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a CPU tensor's bytes; on an accelerator, `weighted_byte_sum` of them, computed there."""
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    if data.device.type == "cpu":
        return hashlib.sha256(data.numpy()).hexdigest()
    return f"{weighted_byte_sum(data):016x}"


def weights_fingerprint(module: torch.nn.Module) -> str:
    """Hex digest that changes when any weight or buffer of `module` changes (name, dtype, shape or value)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|{tensor_digest(tensor)}\n".encode())
    return digest.hexdigest()
