"""The seed's block manager and scheduler, transcribed exactly from its design notes
(``/work/shared/seeds/000_66baa55476502625.txt``): a scheduler written against its
own block manager, catching its own ``OutOfBlocks``. ``kvcheck verify-scheduler
tests/scheduler/seed_shaped.py:Scheduler`` drives the two together."""

from collections import deque


class OutOfBlocks(Exception):
    pass


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free = deque(range(num_blocks))
        self.ref = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def _alloc(self) -> int:
        if not self.free:
            raise OutOfBlocks
        b = self.free.popleft()
        self.ref[b] = 1
        return b

    def _release(self, b: int) -> None:
        self.ref[b] -= 1
        assert self.ref[b] >= 0, "double free"
        if self.ref[b] == 0:
            self.free.append(b)

    def allocate(self, seq: int, n_tokens: int) -> None:
        need = -(-n_tokens // self.block_size)          # ceil division
        if need > len(self.free):
            raise OutOfBlocks                           # all or nothing
        self.tables[seq] = [self._alloc() for _ in range(need)]
        self.lens[seq] = n_tokens

    def append_slot(self, seq: int):
        """Reserve the slot for one new token: (block, offset, cow_src)."""
        table, n = self.tables[seq], self.lens[seq]
        offset, cow_src = n % self.block_size, None
        if offset == 0:                                 # last block full
            table.append(self._alloc())
        elif self.ref[table[-1]] > 1:                   # shared partial block
            new = self._alloc()                         # allocate before releasing
            cow_src = table[-1]
            self._release(cow_src)
            table[-1] = new                             # caller copies cow_src -> new
        self.lens[seq] = n + 1
        return table[-1], offset, cow_src

    def fork(self, parent: int, child: int) -> None:
        for b in self.tables[parent]:
            self.ref[b] += 1
        self.tables[child] = list(self.tables[parent])
        self.lens[child] = self.lens[parent]

    def free_seq(self, seq: int) -> None:
        for b in self.tables.pop(seq):
            self._release(b)
        del self.lens[seq]


class Scheduler:
    def __init__(self, bm: BlockManager, watermark_blocks: int = 1):
        self.bm, self.wm = bm, watermark_blocks
        self.waiting = deque()        # (seq, tokens to prefill)
        self.running: list[int] = []

    def step(self) -> list[int]:
        while self.waiting:                             # FCFS admission
            seq, n = self.waiting[0]
            need = -(-n // self.bm.block_size)
            if len(self.bm.free) - need < self.wm:
                break
            self.waiting.popleft()
            self.bm.allocate(seq, n)
            self.running.append(seq)
        decoded = []
        for seq in list(self.running):                  # oldest first
            while seq in self.running:
                try:
                    self.bm.append_slot(seq)
                    decoded.append(seq)
                    break
                except OutOfBlocks:                     # preempt the newest
                    victim = self.running.pop()
                    n = self.bm.lens[victim]
                    self.bm.free_seq(victim)
                    self.waiting.appendleft((victim, n))  # recompute prompt + output
        return decoded
