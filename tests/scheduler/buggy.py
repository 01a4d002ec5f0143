"""A corpus of buggy schedulers, one per common mistake.

Each subclasses the reference ``Scheduler`` and breaks exactly one rule.
``CORPUS`` maps a name to (class, the violated rule kvcheck must name,
maximum number of requests in the minimal workload).
"""

from kvcheck.impl.errors import OutOfBlocks
from kvcheck.impl.scheduler import Scheduler, blocks_for


class _Decode(Scheduler):
    """The reference admission; subclasses override ``decode``."""

    def admit(self):
        while self.waiting:
            seq, n = self.waiting[0]
            if len(self.bm.free) - blocks_for(n, self.bm.block_size) < self.watermark:
                break
            self.waiting.popleft()
            self._admit(seq, n)
            self.running.append(seq)

    def step(self):
        self.admit()
        return self.decode()


class PreemptCurrent(_Decode):
    """Seed mistake: preempt the sequence that hit out-of-blocks, not the newest."""

    def decode(self):
        decoded = []
        for seq in list(self.running):
            try:
                self.bm.append_slot(seq)
                decoded.append(seq)
            except OutOfBlocks:
                self.running.remove(seq)  # bug: the victim should be running[-1]
                n = self.bm.lens[seq]
                self.bm.free_seq(seq)
                self.waiting.appendleft((seq, n))
        return decoded


class RequeuePromptOnly(Scheduler):
    """Seed mistake: re-queue a victim with its prompt length, dropping what it generated."""

    def __init__(self, bm, watermark_blocks=1):
        super().__init__(bm, watermark_blocks)
        self.prompt = {}

    def _admit(self, seq, n_tokens):
        self.prompt.setdefault(seq, n_tokens)
        super()._admit(seq, n_tokens)

    def step(self):
        decoded = super().step()
        # bug: rewrite the re-queued lengths to the original prompts
        self.waiting = type(self.waiting)((q, self.prompt.get(q, n)) for q, n in self.waiting)
        return decoded


class SkipAhead(Scheduler):
    """Admission that skips a request that does not fit and admits later ones."""

    def step(self):
        kept = []
        while self.waiting:
            seq, n = self.waiting.popleft()
            if len(self.bm.free) - blocks_for(n, self.bm.block_size) < self.watermark:
                kept.append((seq, n))  # bug: keep looking behind it
                continue
            self._admit(seq, n)
            self.running.append(seq)
        self.waiting.extend(kept)
        return _decode(self)


class IgnoreWatermark(Scheduler):
    """Admission while anything fits, ignoring the watermark."""

    def step(self):
        while self.waiting:
            seq, n = self.waiting[0]
            if blocks_for(n, self.bm.block_size) > len(self.bm.free):  # bug: no watermark
                break
            self.waiting.popleft()
            self._admit(seq, n)
            self.running.append(seq)
        return _decode(self)


class DecodeTwice(_Decode):
    """A newly admitted sequence gets its first token at admission and again in decode."""

    def step(self):
        before = set(self.running)
        self.admit()
        extra = []
        for seq in self.running:
            if seq not in before:
                try:
                    self.bm.append_slot(seq)  # bug: a second slot this step
                    extra.append(seq)
                except OutOfBlocks:
                    pass
        return extra + _decode(self)


class RequeueAtBack(Scheduler):
    """A victim goes to the back of waiting, behind requests that arrived later."""

    def step(self):
        decoded = super().step()
        return decoded

    def _evict(self, seq):
        super()._evict(seq)
        self._moved = seq

    def __init__(self, bm, watermark_blocks=1):
        super().__init__(bm, watermark_blocks)
        self.waiting = _BackQueue()


class _BackQueue(__import__("collections").deque):
    def appendleft(self, item):  # bug: re-queued at the back
        self.append(item)


class PreemptWithoutFree(_Decode):
    """A victim is re-queued but its blocks are never freed."""

    def decode(self):
        decoded = []
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            try:
                self.bm.append_slot(seq)
            except OutOfBlocks:
                victim = self.running.pop()
                self.waiting.appendleft((victim, self.bm.lens[victim]))  # bug: no free_seq
                if victim == seq:
                    break
                continue
            decoded.append(seq)
            i += 1
        return decoded


class FinishKeepsBlocks(Scheduler):
    """finish() forgets to free the sequence's blocks."""

    def finish(self, seq):
        self.running.remove(seq)  # bug: no free_seq


def _decode(s):
    """The reference decode loop (oldest first, preempt the newest)."""
    decoded, i = [], 0
    while i < len(s.running):
        seq = s.running[i]
        try:
            s.bm.append_slot(seq)
        except OutOfBlocks:
            victim = s.running.pop()
            n = s.bm.lens[victim]
            s._evict(victim)
            s.waiting.appendleft((victim, n))
            continue
        decoded.append(seq)
        i += 1
    return decoded


CORPUS = {
    "preempt-current": (PreemptCurrent,
                        "on out-of-blocks the newest running sequence is preempted", 4),
    "requeue-prompt-only": (RequeuePromptOnly,
                            "a preempted sequence is re-queued with its full length "
                            "(prompt + generated)", 3),
    "skip-ahead": (SkipAhead, "admission is FCFS: nothing behind the head skips ahead", 3),
    "ignore-watermark": (IgnoreWatermark, "admission keeps free blocks minus the request's need "
                                          "at or above the watermark", 3),
    "decode-twice": (DecodeTwice, "no sequence is decoded twice in a step", 1),
    "requeue-at-back": (RequeueAtBack, "preempted sequences go to the front of waiting (oldest "
                                       "first), the rest keep their order", 3),
    "preempt-without-free": (PreemptWithoutFree, "a waiting sequence holds no device blocks", 3),
    "finish-keeps-blocks": (FinishKeepsBlocks, "finish: the sequence's blocks are released", 1),
}
