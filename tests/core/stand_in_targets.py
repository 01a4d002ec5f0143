"""Adapters whose stand-ins lack what the engine reads (tests/core/test_stand_in_gap.py):
kvcheck's gap, which must end the run without a verdict, never a FAIL blamed on the engine."""

from __future__ import annotations

from kvcheck.engines import Settings, StandIn
from kvcheck.impl.block_manager import BlockManager


class _Worker(StandIn):
    WHERE = "tests/core/stand_in_targets.py"

    def ready(self) -> bool:
        return True


class WorkerLacksAMethod(BlockManager):
    """The engine calls a method its stand-in worker does not define, on the third append."""

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.worker, self.appends = _Worker(), 0

    def append_slot(self, seq):
        self.appends += 1
        if self.appends == 3:
            self.worker.flush(seq)
        return super().append_slot(seq)


class EngineWrapsTheGap(BlockManager):
    """The engine reads a setting the stand-in config lacks, and wraps what it caught in an
    error of its own (the gap is in the chain); a setting it probes with a default is given
    the default."""

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.config = Settings("vllm_config", "tests/core/stand_in_targets.py", block_size=block_size)
        assert getattr(self.config, "watermark_config", None) is None  # a probe: the default

    def free_seq(self, seq):
        try:
            _ = self.config.watermark_config
        except Exception as exc:
            raise RuntimeError("the engine failed to read its config") from exc
        return super().free_seq(seq)


class OwnAttributeError(BlockManager):
    """The engine's own AttributeError: a crash, judged (no stand-in involved)."""

    def free_seq(self, seq):
        return self.no_such_thing
