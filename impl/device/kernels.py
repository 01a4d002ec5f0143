"""The three data-movement kernels of a paged KV cache, in Triton and in plain torch.

Cache layout (one tensor for K, one for V)::

    [num_layers, num_blocks, block_size, num_kv_heads, head_dim]   contiguous

so a *slot* ``block * block_size + offset`` is one row of ``num_kv_heads *
head_dim`` elements inside its layer, and a block is ``block_size`` rows.

``copy_blocks(kc, vc, src, dst)``
    copy-on-write: every block ``src[i]`` -> ``dst[i]`` in every layer, K and V,
    in **one** launch (vLLM's ``copy_blocks``). The pairs must be independent
    (no ``dst`` is also a ``src``), which the block manager guarantees.
``write_slots(kc, vc, k, v, slots)``
    the new tokens' K/V ``[num_layers, n, num_kv_heads, head_dim]`` into their
    slots, in **one** launch (vLLM's ``reshape_and_cache``); a negative slot is
    padding and skipped.
``gather(kc, vc, tables, tok_seq, tok_pos)``
    paged read-back: output token ``i`` is position ``tok_pos[i]`` of the
    sequence whose block table is row ``tok_seq[i]`` of ``tables``; the kernel
    itself looks the block up in the table.

Each has a Triton kernel and a torch fallback with the same results.
``backend`` is ``"triton"`` or ``"torch"``; :func:`resolve_backend` picks one
for a device. Triton runs on CUDA, and on the CPU only under its interpreter
(``TRITON_INTERPRET=1`` set before triton is imported), which executes the
very same kernel code with numpy, so CPU CI tests the kernels themselves.
"""

from __future__ import annotations

import os

import torch

try:  # triton is optional at run time: the torch fallback needs nothing else
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None

BACKENDS = ("auto", "triton", "torch")


def interpreting() -> bool:
    """Whether Triton kernels run under the CPU interpreter in this process."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_available(device: torch.device) -> str | None:
    """``None`` if Triton can run kernels on ``device``, else the reason it cannot."""
    if triton is None:
        return "triton is not installed"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and interpreting():
        return None
    return (f"triton cannot run on {device.type} without its interpreter "
            "(set TRITON_INTERPRET=1 before triton is imported)")


def resolve_backend(backend: str, device: torch.device) -> str:
    """``auto`` -> ``triton`` where it can run, else ``torch``. Raises ValueError."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    why = triton_available(device)
    if backend == "auto":
        return "torch" if why else "triton"
    if backend == "triton" and why:
        raise ValueError(why)
    return backend


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


# Tile sizes. On a GPU: small tiles, many programs (bandwidth). Under the
# interpreter every program is a Python-level loop iteration: few big tiles.
def _tiles(row: int, block_numel: int) -> dict:
    if interpreting():
        return {"copy": _pow2(block_numel), "tok": 64}
    return {"copy": min(_pow2(block_numel), 4096), "tok": max(1, 4096 // _pow2(row))}


if triton is not None:

    @triton.jit
    def _copy_blocks_kernel(k_ptr, v_ptr, pairs_ptr, layer_stride, block_numel,
                            BLOCK: tl.constexpr):
        pair = tl.program_id(0)
        layer = tl.program_id(1).to(tl.int64)
        chunk = tl.program_id(2)
        src = tl.load(pairs_ptr + 2 * pair).to(tl.int64)
        dst = tl.load(pairs_ptr + 2 * pair + 1).to(tl.int64)
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < block_numel
        base = layer * layer_stride
        s = base + src * block_numel + offs
        d = base + dst * block_numel + offs
        tl.store(k_ptr + d, tl.load(k_ptr + s, mask=mask), mask=mask)
        tl.store(v_ptr + d, tl.load(v_ptr + s, mask=mask), mask=mask)

    @triton.jit
    def _write_slots_kernel(kc_ptr, vc_ptr, k_ptr, v_ptr, slots_ptr, n_tokens,
                            cache_layer_stride, new_layer_stride, row,
                            TOK: tl.constexpr, ROW: tl.constexpr):
        layer = tl.program_id(1).to(tl.int64)
        toks = tl.program_id(0) * TOK + tl.arange(0, TOK)
        tmask = toks < n_tokens
        slots = tl.load(slots_ptr + toks, mask=tmask, other=-1).to(tl.int64)
        tmask = tmask & (slots >= 0)
        cols = tl.arange(0, ROW)
        mask = tmask[:, None] & (cols < row)[None, :]
        src = layer * new_layer_stride + toks.to(tl.int64)[:, None] * row + cols[None, :]
        dst = layer * cache_layer_stride + slots[:, None] * row + cols[None, :]
        tl.store(kc_ptr + dst, tl.load(k_ptr + src, mask=mask), mask=mask)
        tl.store(vc_ptr + dst, tl.load(v_ptr + src, mask=mask), mask=mask)

    @triton.jit
    def _gather_kernel(kc_ptr, vc_ptr, ko_ptr, vo_ptr, tables_ptr, seq_ptr, pos_ptr,
                       n_tokens, table_stride, block_size,
                       cache_layer_stride, out_layer_stride, row,
                       TOK: tl.constexpr, ROW: tl.constexpr):
        layer = tl.program_id(1).to(tl.int64)
        toks = tl.program_id(0) * TOK + tl.arange(0, TOK)
        tmask = toks < n_tokens
        seq = tl.load(seq_ptr + toks, mask=tmask, other=0).to(tl.int64)
        pos = tl.load(pos_ptr + toks, mask=tmask, other=0).to(tl.int64)
        block = tl.load(tables_ptr + seq * table_stride + pos // block_size,
                        mask=tmask, other=0).to(tl.int64)
        slot = block * block_size + pos % block_size
        cols = tl.arange(0, ROW)
        mask = tmask[:, None] & (cols < row)[None, :]
        src = layer * cache_layer_stride + slot[:, None] * row + cols[None, :]
        dst = layer * out_layer_stride + toks.to(tl.int64)[:, None] * row + cols[None, :]
        tl.store(ko_ptr + dst, tl.load(kc_ptr + src, mask=mask), mask=mask)
        tl.store(vo_ptr + dst, tl.load(vc_ptr + src, mask=mask), mask=mask)


def _dims(kc: torch.Tensor) -> tuple[int, int, int, int]:
    """``(layers, num_blocks, block_size, row)`` of a cache tensor."""
    L, nb, bs, h, d = kc.shape
    return L, nb, bs, h * d


# -- copy_blocks -------------------------------------------------------------------
def copy_blocks(kc, vc, src: torch.Tensor, dst: torch.Tensor, backend: str = "torch") -> None:
    """Copy block ``src[i]`` into ``dst[i]`` (all layers, K and V) in one launch."""
    if src.numel() == 0:
        return
    if backend == "triton":
        L, nb, bs, row = _dims(kc)
        block_numel = bs * row
        pairs = torch.stack((src, dst), dim=1).to(torch.int64).contiguous()
        tile = _tiles(row, block_numel)["copy"]
        grid = (pairs.shape[0], L, triton.cdiv(block_numel, tile))
        _copy_blocks_kernel[grid](kc, vc, pairs, nb * block_numel, block_numel, BLOCK=tile)
    else:
        kc[:, dst] = kc[:, src]
        vc[:, dst] = vc[:, src]


# -- write_slots --------------------------------------------------------------------
def write_slots(kc, vc, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor,
                backend: str = "torch") -> None:
    """Write token ``i``'s K/V ``k[:, i]``/``v[:, i]`` into slot ``slots[i]``, one launch."""
    n = slots.numel()
    if n == 0:
        return
    L, nb, bs, row = _dims(kc)
    if backend == "triton":
        k, v = k.contiguous(), v.contiguous()
        tiles = _tiles(row, bs * row)
        tok, width = min(tiles["tok"], _pow2(n)), _pow2(row)
        grid = (triton.cdiv(n, tok), L)
        _write_slots_kernel[grid](kc, vc, k, v, slots.to(torch.int64).contiguous(), n,
                                  nb * bs * row, n * row, row, TOK=tok, ROW=width)
    else:
        keep = slots >= 0
        s = slots[keep]
        kc.view(L, nb * bs, *kc.shape[3:])[:, s] = k[:, keep]
        vc.view(L, nb * bs, *vc.shape[3:])[:, s] = v[:, keep]


# -- gather -------------------------------------------------------------------------
def gather(kc, vc, tables: torch.Tensor, tok_seq: torch.Tensor, tok_pos: torch.Tensor,
           backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """K/V ``[num_layers, n, num_kv_heads, head_dim]`` of the tokens named by
    ``(tok_seq[i], tok_pos[i])``, read through the block tables ``tables``."""
    L, nb, bs, row = _dims(kc)
    n = tok_seq.numel()
    shape = (L, n, *kc.shape[3:])
    if backend == "triton":
        ko = torch.empty(shape, dtype=kc.dtype, device=kc.device)
        vo = torch.empty(shape, dtype=vc.dtype, device=vc.device)
        if n == 0:
            return ko, vo
        tables = tables.to(torch.int64).contiguous()
        tiles = _tiles(row, bs * row)
        tok, width = min(tiles["tok"], _pow2(n)), _pow2(row)
        grid = (triton.cdiv(n, tok), L)
        _gather_kernel[grid](kc, vc, ko, vo, tables, tok_seq.contiguous(),
                             tok_pos.contiguous(), n, tables.shape[1], bs,
                             nb * bs * row, n * row, row, TOK=tok, ROW=width)
        return ko, vo
    blocks = tables[tok_seq, torch.div(tok_pos, bs, rounding_mode="floor")]
    slots = blocks.to(torch.int64) * bs + tok_pos % bs
    flat = (L, nb * bs, *kc.shape[3:])
    return kc.view(flat)[:, slots], vc.view(flat)[:, slots]
