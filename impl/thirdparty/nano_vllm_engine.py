"""Adapter: nano-vllm's engine core -- the release's own ``Scheduler`` with its own
``BlockManager``, ``Sequence`` and ``SamplingParams`` -- driven step by step with no model.

Issue 34 §1. nano-vllm-fork 20260210 (``nano-vllm-engine``, ``nano-vllm-engine@20260210``:
the ``nano-vllm`` install key, ``kvcheck install nano-vllm``); upstream nano-vllm's scheduler
as nano-vllm-npu carries it (0.0.1.post1 .. 0.0.2) as ``nano-vllm-npu-engine[@VERSION]``
(``nano_vllm_npu_engine.py``, ``kvcheck install nano-vllm-npu``). What runs is the
release's ``nanovllm/engine/scheduler.py``, ``block_manager.py``, ``sequence.py`` and
``nanovllm/sampling_params.py``, executed from the installed files (``_loader``; the
package's ``__init__.py``, which imports torch and transformers, is not run), with the
real ``xxhash`` and ``numpy``. The adapter plays ``LLMEngine.step``
(``nanovllm/engine/llm_engine.py``) and the model runner:

1. a request arrives: ``Scheduler.add(Sequence(prompt, SamplingParams(max_tokens=...)))``
   (``LLMEngine.add_request`` without a tokenizer: the prompt is token ids);
2. ``schedule()`` -> ``(seqs, is_prefill)``;
3. the model runner's output, which kvcheck generates: one sampled token per scheduled
   sequence (prefill and decode alike, as ``ModelRunner.run`` returns), the end-of-sequence
   token ``STOP`` with probability 0.08 (``Config.eos``), a function of the step's ``gen``
   and the request's id;
4. ``postprocess(seqs, token_ids)``: the release appends each token and finishes a
   sequence on its EOS or at ``max_tokens``, deallocating it.

Preemption is the release's own ``Scheduler.preempt``, called by its ``schedule()``.

Stand-ins, in one place:

``nanovllm.config`` (``Config``)
    the real ``Config.__post_init__`` needs a model directory, loads its HF config through
    ``transformers`` and requires ``kvcache_block_size % 256 == 0``; ``Scheduler.__init__``
    only reads ``max_num_seqs``, ``max_num_batched_tokens``, ``eos``,
    ``num_kvcache_blocks`` and ``kvcache_block_size``. The stand-in is a record of those
    (the run's ``max_seqs``, ``budget``, ``STOP``, ``num_blocks``, ``block_size``); small
    block sizes are outside what the real ``Config`` accepts (as for the ``nano-vllm``
    block-manager target), block size 1 is refused (``may_append`` never grows a table
    then). ``Sequence.block_size`` is a class attribute (256) the real ``LLMEngine`` never
    changes; each ``Sequence`` gets the run's block size on the instance.

Nothing else is stood in: ``SamplingParams`` is the release's own (with its validation).

What nano-vllm's engine does not have is refused in words, never re-enacted: prefix caching
off (the ``BlockManager`` always caches), priority scheduling, speculative decoding, a
``budget`` below ``max_model_len`` (the real ``Config`` asserts
``max_num_batched_tokens >= max_model_len``), and aborts (nano-vllm has no abort:
``aborts = False``, so the engine model draws none). nano-vllm has no chunked prefill and
stops a request only at its EOS or ``max_tokens``: a sequence (re)admitted by prefill must
fit the step's budget whole, so the engine model draws only requests whose prompt and
output fit ``longest_request`` tokens (``max_model_len`` where the run sets it, else the
budget): the requests the real ``Config`` lets a user send. nano-vllm checks no
``max_model_len`` against the pool at start-up (its ``ModelRunner`` sizes the pool from the
free memory and asks only for one block at least; upstream's and the npu fork's too), so
no length is refused for the pool here, unlike vLLM's targets (``vllm_config.check_pool``).

KV calls, recorded at the ``BlockManager``'s boundary and given to the engine oracle under
the names whose contracts they satisfy (``KVCall``):

* ``allocate(seq)`` -- a lookup and an allocation in one call: recorded as a
  ``get_computed_blocks`` whose result is the blocks ``allocate`` counted as cached (the
  first ``num_cached_tokens // block_size`` of the table: each must hold the requested
  prefix) and an ``allocate_slots`` from those hits to the whole table, the rest being the
  new blocks (the ones the forward pass writes);
* ``may_append(seq)`` -- an ``allocate_slots`` returning the block it appended (none
  within a block);
* ``can_allocate`` / ``can_append`` answering ``False`` -- a refused ``allocate_slots``
  (result ``None``: nothing may change); answering ``True`` they only precede the call
  recorded above;
* ``deallocate(seq)`` -- ``free``: the sequence holds nothing afterwards.

What the forward pass writes: prefill, the sequence's tokens from ``num_cached_tokens`` to
its length; decode, its last token (the one sampled in the previous step) at ``len - 1``.
A step's ``scheduled`` count is that number of tokens (``ModelRunner.prepare_prefill``'s
``seqlen_q``). Between steps a running sequence has computed every token but the last
(sampled, not yet run): ``computed = len(seq) - 1``.

Observation: the scheduler's ``running`` and ``waiting`` deques, each sequence's status,
``block_table`` and token ids, ``Block.ref_count``, ``free_block_ids``,
``hash_to_block_id``; a block's hash is its ``Block.hash`` while a cache entry names it
(a free block named by an entry is revivable: on nano-vllm-npu freed blocks keep their
entries); a sequence's block hashes are the release's own ``compute_hash`` chained over
its full blocks, as ``allocate`` computes them.
"""

from __future__ import annotations

import random
import types
from typing import Any

from ..errors import MisuseError
from . import _loader, install
from ._loader import Loaded
from .vllm_v1_engine import KVCall, StepResult

ENGINE_KEY = "nano-vllm"
STOP = 1  # Config.eos: the end-of-sequence token the generated output samples rarely
VOCAB = 8  # generated tokens: 2 .. VOCAB, or STOP


def _stub_config(mod: types.ModuleType, _: Loaded) -> None:
    class Config:
        """The settings ``Scheduler.__init__`` reads (see the module doc's stand-ins)."""

        def __init__(self, max_num_batched_tokens: int, max_num_seqs: int, eos: int,
                     kvcache_block_size: int, num_kvcache_blocks: int, max_model_len: int):
            self.max_num_batched_tokens = max_num_batched_tokens
            self.max_num_seqs = max_num_seqs
            self.eos = eos
            self.kvcache_block_size = kvcache_block_size
            self.num_kvcache_blocks = num_kvcache_blocks
            self.max_model_len = max_model_len

    mod.Config = Config


def load(key: str = ENGINE_KEY, version: str | None = None) -> Loaded:
    """The release's scheduler, block manager, sequence and sampling modules."""
    dist = install.select(key, version)
    _loader.require(dist)
    top = dist.top
    files = tuple(f"{top}.{m}" for m in ("engine.scheduler", "engine.block_manager",
                                          "engine.sequence", "sampling_params"))
    return _loader.load(dist, files, {f"{top}.config": _stub_config}, entry=files)


class _Recorder:
    """One ``BlockManager`` method, recorded at the manager's boundary as the engine
    oracle's KV calls (see the module doc). A plain object (not a closure), so a deep copy
    of the scheduler records into the copy."""

    def __init__(self, target: NanoEngineTarget, manager: Any, name: str):
        self.target, self.manager, self.name = target, manager, name
        self.method = getattr(type(manager), name)

    def __call__(self, seq: Any):
        t, m = self.target, self.manager
        before, free_before = list(seq.block_table), len(m.free_block_ids)
        result = self.method(m, seq)
        after, free_after = list(seq.block_table), len(m.free_block_ids)
        rid = str(t.ids[seq.seq_id])

        def call(name, res, blocks_before):
            t.kv_calls.append(KVCall(name, rid, (), {}, res, blocks_before, after,
                                     free_before, free_after, t._hashes(seq),
                                     list(seq.token_ids)))

        if self.name in ("can_allocate", "can_append"):
            if not result:  # a refused allocation: nothing may change
                call("allocate_slots", None, before)
        elif self.name == "allocate":
            k = seq.num_cached_tokens // m.block_size
            hits = after[:k]
            call("get_computed_blocks", ([m.blocks[b] for b in hits], seq.num_cached_tokens),
                 before)
            call("allocate_slots", [m.blocks[b] for b in after[k:]], hits)
        elif self.name == "may_append":
            call("allocate_slots", [m.blocks[b] for b in after[len(before):]], before)
        else:  # deallocate
            call("free", None, before)
        return result


class NanoEngineTarget:
    """nano-vllm's engine core on the release's own ``Scheduler`` (see the module doc).

    ``add(seq, tokens, max_new, priority)`` -- ``Scheduler.add(Sequence(...))``;
    ``step(gen)`` -- ``schedule()``, the generated tokens, ``postprocess``; returns a
    ``StepResult``. No ``abort`` (``aborts = False``: nano-vllm has none)."""

    aborts = False
    block_offset = 0  # the oracle's block ids are nano-vllm's

    def __init__(self, num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
                 policy: str = "fcfs", caching: bool = True, spec: int = 0,
                 max_model_len: int = 0, key: str = ENGINE_KEY, version: str | None = None):
        if num_blocks < 1 or block_size < 2:
            raise MisuseError("nano-vllm needs num_blocks >= 1 and block_size >= 2 (at block "
                              "size 1 its may_append never takes a new block)")
        if not caching:
            raise MisuseError("nano-vllm's BlockManager always caches prefixes: no prefix "
                              "caching off")
        if policy != "fcfs":
            raise MisuseError(f"nano-vllm's scheduler has no {policy} scheduling (fcfs only)")
        if spec:
            raise MisuseError("nano-vllm has no speculative decoding")
        if max_model_len and budget < max_model_len:
            raise MisuseError(f"nano-vllm's Config requires max_num_batched_tokens >= "
                              f"max_model_len ({budget} < {max_model_len})")
        mods = load(key, version)
        top = mods.dist.top
        self.version = mods.dist.version
        self._mods = mods
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_model_len = max_model_len
        # no chunked prefill, no stop at max_model_len: a sequence fits the budget whole
        self.longest_request = max_model_len or budget
        config = mods[f"{top}.config"].Config(budget, max_seqs, STOP, block_size, num_blocks,
                                              max_model_len or budget)
        self.scheduler = mods[f"{top}.engine.scheduler"].Scheduler(config)
        self.manager = self.scheduler.block_manager
        self._Sequence = mods[f"{top}.engine.sequence"].Sequence
        self._Params = mods[f"{top}.sampling_params"].SamplingParams
        self._Status = mods[f"{top}.engine.sequence"].SequenceStatus
        self.kv_calls: list[KVCall] = []
        for name in ("can_allocate", "allocate", "can_append", "may_append", "deallocate"):
            setattr(self.manager, name, _Recorder(self, self.manager, name))
        self.requests: dict[int, Any] = {}  # every request added (finished ones kept)
        self.ids: dict[int, int] = {}  # Sequence.seq_id -> request id

    def __deepcopy__(self, memo):
        """A copy of the engine: ``Sequence`` defines ``__getstate__`` for the model
        runner's IPC (five fields only), so each is copied by its ``__dict__``."""
        import copy

        for s in self.requests.values():
            if id(s) not in memo:
                new_s = object.__new__(type(s))
                memo[id(s)] = new_s
                new_s.__dict__.update(copy.deepcopy(s.__dict__, memo))
        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            setattr(new, k, v if k in ("_mods", "_Sequence", "_Params", "_Status")
                    else copy.deepcopy(v, memo))
        return new

    # -- operations ---------------------------------------------------------------------
    def add(self, seq: int, tokens: list[int], max_new: int, priority: int = 0) -> None:
        s = self._Sequence(list(tokens), self._Params(max_tokens=max_new))
        s.block_size = self.block_size  # a class attribute (256) in nano-vllm
        self.requests[seq] = s
        self.ids[s.seq_id] = seq
        self.scheduler.add(s)

    def abort(self, seq: int) -> None:
        raise MisuseError("nano-vllm has no abort")

    def step(self, gen: int) -> StepResult:
        del self.kv_calls[:]
        seqs, is_prefill = self.scheduler.schedule()
        calls_in_schedule = list(self.kv_calls)
        scheduled, writes, sampled, tokens = {}, {}, {}, []
        for s in seqs:
            q = self.ids[s.seq_id]
            start = s.num_cached_tokens if is_prefill else len(s) - 1
            toks = list(s.token_ids[start:])
            scheduled[q] = len(toks)
            writes[q] = (start, toks, list(s.block_table))
            rng = random.Random(gen * 1_000_003 + q)
            tok = STOP if rng.random() < 0.08 else rng.randint(2, VOCAB)
            sampled[q] = [tok]
            tokens.append(tok)
        self.scheduler.postprocess(seqs, tokens)
        return StepResult(scheduled, {}, sampled, {}, writes, calls_in_schedule,
                          list(self.kv_calls[len(calls_in_schedule):]))

    # -- observation -----------------------------------------------------------------
    def status(self, seq: int) -> str:
        return self.requests[seq].status.name

    def computed(self, seq: int) -> int:
        """Every token but the last (sampled by the previous step, run by the next) while
        the sequence runs; none otherwise."""
        s = self.requests[seq]
        return len(s) - 1 if s.status == self._Status.RUNNING else 0

    def blocks(self, seq: int) -> list[int]:
        return list(self.requests[seq].block_table)

    def running(self) -> list[int]:
        return [self.ids[s.seq_id] for s in self.scheduler.running]

    def waiting(self) -> list[int]:
        return [self.ids[s.seq_id] for s in self.scheduler.waiting]

    def refcount(self, block: int) -> int:
        return self.manager.blocks[block].ref_count

    def free_blocks(self) -> list[int]:
        return list(self.manager.free_block_ids)

    def num_free(self) -> int:
        return len(self.manager.free_block_ids)

    def token_ids(self, seq: int) -> list[int]:
        return list(self.requests[seq].token_ids)

    def _hashes(self, s: Any) -> list:
        m, bs = self.manager, self.block_size
        out, h = [], -1
        for i in range(len(s) // bs):
            h = m.compute_hash(s.token_ids[i * bs:(i + 1) * bs], h)
            out.append(h)
        return out

    def block_hashes(self, seq: int) -> list:
        return self._hashes(self.requests[seq])

    def cached_entries(self) -> list[tuple[Any, int]]:
        return list(self.manager.hash_to_block_id.items())

    def block_hash(self, block: int):
        h = self.manager.blocks[block].hash
        return h if h != -1 and self.manager.hash_to_block_id.get(h) == block else None

    def is_finished(self, seq: int) -> bool:
        return self.requests[seq].is_finished


def make(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
         policy: str = "fcfs", caching: bool = True, spec: int = 0,
         version: str | None = None, max_model_len: int | None = None) -> NanoEngineTarget:
    """The engine target: nano-vllm-fork's scheduler over ``num_blocks`` blocks of
    ``block_size``, a step's token budget ``budget`` and ``max_seqs`` (see the module doc
    for what it refuses)."""
    return NanoEngineTarget(num_blocks, block_size, budget, max_seqs, policy, caching, spec,
                            max_model_len or 0, ENGINE_KEY, version)
