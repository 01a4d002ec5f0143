"""The tiers model's device data level: K/V that really lives in each pool and moves with
every copy (issue 33: a swapped-in or loaded block holds what was stored, a host hit
returns the right tokens' K/V: the bytes, not only the refcounts).

The oracle's ghost (``TierOracle.content``) already says what each block of each pool
holds: the prefix id of the tokens up to its last written slot, following every copy a
store, load or swap makes. A *data target* also holds K/V and lets kvcheck read it back;
then, after every step, each block the ghost knows (and no pending transfer is still
writing) is read and compared, slot by slot, with the K/V of the tokens it holds. A copy
kernel that moves the wrong block, in the wrong order, from the wrong offset, or a
failed load whose blocks are never recomputed, keeps every refcount right and is caught
here.

The data protocol, beyond docs/tiers.md's (both optional: a target without them is
checked structurally only):

    use_kv(kv)                 kvcheck hands over the model it stands in for: ``kv(prefix)``
                               is the K/V row of the last token of ``prefix`` (a tuple of
                               tokens), a 1-D float32 tensor of ``KV_WIDTH`` values, a
                               deterministic function of the whole prefix (as attention's
                               K/V depend on every token before): the target writes
                               ``kv(tokens[:i + 1])`` into token i's slot when it computes
                               that token (an allocation's tokens, a load's tokens past its
                               hits, an appended token, a failed load's recomputed ones)
    block_data(pool, b)        block b of pool ``pool`` as stored: a tensor of
                               ``block_size`` rows of ``KV_WIDTH`` values, on any device
    pool_data(pool) (optional) the whole pool at once, ``[blocks, block_size, KV_WIDTH]``
                               (one read per pool per step instead of one per block)

The stand-in: ``kv`` replaces the model's forward pass (no weights, no tokenizer); it is
the one thing here that is not the target's own. The comparison is exact (the copies move
bits; nothing is computed twice).
"""

from __future__ import annotations

import hashlib
import struct

from kvcheck.spec import tiers as T

KV_WIDTH = 8  # values per token's K/V row (one layer, K and V of a small head, flattened)


def _import_torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a test dependency
        raise RuntimeError("the tiers data level needs torch (pip install torch)") from exc
    return torch


def kv(prefix: tuple):
    """The K/V row of the last token of ``prefix``: KV_WIDTH float32 values drawn from a
    hash of the whole prefix (so the same token after another prefix differs)."""
    torch = _import_torch()
    h = hashlib.blake2b(repr(tuple(prefix)).encode(), digest_size=4 * KV_WIDTH).digest()
    ints = struct.unpack(f"<{KV_WIDTH}I", h)
    return torch.tensor([(i % 20011) / 64.0 - 150.0 for i in ints], dtype=torch.float32)


def is_data_target(target) -> bool:
    return callable(getattr(target, "block_data", None)) and \
        callable(getattr(target, "use_kv", None))


class DataLevel:
    """The oracle's read-back: ``check(state, prefix_of)`` after each step. What each pool
    should hold is kept as a tensor beside the target's (``want``, with ``mask`` marking
    the slots written), updated where the ghost's content changed; each step reads every
    pool whole (``pool_data``, or ``block_data`` block by block) and compares it in one go:
    a stray write into a block whose content did not change is caught too."""

    def __init__(self, target, block_size: int):
        self.target = target
        self.bs = block_size
        self.torch = _import_torch()
        self.reads = 0  # blocks read back and compared
        self.want: dict[str, object] = {}
        self.mask: dict[str, object] = {}
        self.seen: dict[str, dict] = {}  # pool -> block -> the prefix id ``want`` holds
        self.prefix_of = None

    def _rows(self, prefix: tuple):
        """The rows a block ending at ``prefix``'s last token holds: the K/V of each of its
        tokens, from the first of its block up to the last."""
        start = (len(prefix) - 1) // self.bs * self.bs
        return self.torch.stack([kv(prefix[: i + 1]) for i in range(start, len(prefix))])

    def _update(self, p: str, n: int, contents: dict) -> None:
        torch = self.torch
        if p not in self.want:
            self.want[p] = torch.zeros(n, self.bs, KV_WIDTH)
            self.mask[p] = torch.zeros(n, self.bs, dtype=torch.bool)
            self.seen[p] = {}
        seen, want, mask = self.seen[p], self.want[p], self.mask[p]
        for b in [b for b in seen if b not in contents]:
            del seen[b]
            mask[b] = False
        for b, pid in contents.items():
            if seen.get(b, -1) == pid:
                continue
            seen[b] = pid
            mask[b] = False
            if pid is not None and 0 <= b < n:
                rows = self._rows(self.prefix_of(pid))
                want[b, : len(rows)] = rows
                mask[b, : len(rows)] = True

    def _read(self, p: str, n: int):
        torch, t = self.torch, self.target
        pool_data = getattr(t, "pool_data", None)
        if callable(pool_data):
            got = torch.as_tensor(pool_data(p)).detach().to("cpu")
            what = f"pool_data({p!r})"
            shape = (n, self.bs, KV_WIDTH)
        else:
            got = torch.stack([torch.as_tensor(t.block_data(p, b)).detach().to("cpu")
                               for b in range(n)])
            what = f"block_data({p!r}, b)"
            shape = (self.bs, KV_WIDTH)
        if got.dim() != 3 or tuple(got.shape[1:]) != (self.bs, KV_WIDTH) or got.shape[0] < n:
            shown = tuple(got.shape) if what.startswith("pool") else tuple(got.shape[1:])
            raise ValueError(f"{what} has shape {shown}, expected {shape}")
        return got[:n].to(torch.float32)

    def check(self, s: T.TierState, prefix_of) -> tuple | None:
        """The first block whose stored K/V differs from the tokens the ghost says it holds:
        ``(pool, block, witness)``, or None. ``prefix_of(pid)``: the tokens of prefix id
        ``pid``. Raises ``ValueError`` for data of the wrong shape."""
        self.prefix_of = prefix_of
        for p in s.pools():
            n = s.num_blocks(p)
            self._update(p, n, s.contents.get(p, {}))
            mask = self.mask[p].clone()
            for b in s.pending_dst(p):
                if 0 <= b < n:
                    mask[b] = False  # (a transfer is still writing it)
            got = self._read(p, n)
            self.reads += n
            bad = ((got != self.want[p]).any(-1) & mask).nonzero()
            if len(bad):
                b, slot = (int(x) for x in bad[0])
                prefix = prefix_of(self.seen[p][b])
                first = (len(prefix) - 1) // self.bs * self.bs
                hint = _whose(self, got[b, slot], prefix, first + slot)
                return p, b, (f"{p} block {b} should hold the K/V of tokens {first} .. "
                              f"{len(prefix) - 1} of the prefix {list(prefix)[:16]}"
                              f"{' ...' if len(prefix) > 16 else ''}; its slot {slot} "
                              f"(token {first + slot}) holds {hint}")
        return None


def _whose(level: DataLevel, row, prefix: tuple, token: int) -> str:
    """Words for a wrong row: zeros, or the K/V of which token of the same prefix."""
    torch = level.torch
    if not torch.any(row):
        return "zeros (never written)"
    for i in range(len(prefix)):
        if torch.equal(row, kv(prefix[: i + 1])):
            return f"the K/V of token {i} of that prefix, not token {token}"
    return "K/V of other tokens (another request's, or stale)"
