"""The engine model's rules (issue 34): what any correct engine core -- a scheduler with its
KV-cache manager, driven step by step -- keeps, beyond the block-manager and prefix-cache
invariants (``spec.invariants``, ``spec.prefix``) the engine oracle evaluates on the
manager's state. Each rule's name (what a trace and the catalogue name it by) and its
explanation are written here once; ``kvcheck.models.engine.oracle`` checks them on an
engine's observed steps and KV calls (they are about a step's calls and the scheduler's
queues, observed only concretely: no Z3 or CrossHair form).
"""

WRITE_FRESH = "a step writes only into blocks the request was given fresh"
WRITE_FRESH_DOC = ("Nothing is written into a shared or cached block: the forward pass "
                   "writes a scheduled token's KV into the request's block for its position, "
                   "and that block is one allocate_slots gave the request fresh (a block "
                   "reached through a prefix-cache hit is read, never written).")
SLOTS = "every scheduled token has a slot"
SLOTS_DOC = ("After schedule(), a scheduled request's blocks cover every token scheduled "
             "for it (the forward pass writes each one's KV at its position).")
HELD = "a request that is not running holds no block"
HELD_DOC = ("A finished, aborted, preempted or waiting request holds no block: finishing, "
            "aborting and preemption release everything.")
PREALLOC = "a request's blocks are what its tokens need plus at most the preallocation"
PREALLOC_DOC = ("A release that preallocates (to 0.8.4, num_preallocate_tokens) gives a "
                "request the blocks its computed tokens (and the furthest slot a step reached) "
                "need, plus at most its preallocation; table_length then counts the rest as "
                "reserved.")
ROW = "a request's blocks fit its block-table row: at most cdiv(max_model_len, block_size)"
ROW_DOC = ("The model runner's block table has cdiv(max_model_len, block_size) columns per "
           "request: whatever the manager preallocates, a request never holds more blocks "
           "than that (vLLM PR #10730: 0.6.4.post1's preallocation took up to "
           "needed + 64 / block_size blocks, past the row).")
HITS = "get_computed_blocks: every block a cache hit returns holds the requested prefix"
REFUSED = "allocate_slots: a refused allocation changes nothing"
APPENDS = "allocate_slots: the request's blocks grow by its hits and the new blocks returned"
APPENDS_DOC = ("A request's table keeps its blocks and grows by the hits and the new blocks "
               "the call returns; one exception: a block the request was given fresh and has "
               "just filled may be swapped for a cached block holding exactly the same prefix "
               "(vLLM v0's promotion of a full block to an identical cached one, "
               "PrefixCachingBlockAllocator.promote_to_immutable_block), and the step may then "
               "write the same tokens' KV into it again; on a target that shares a partial "
               "block (vLLM v0's BlockSpaceManagerV1 with prefix caching), its last entry, "
               "shared with another request, may be swapped for a fresh copy of it (copy on "
               "write, the call's blocks_to_copy), returned as the call's new block.")
WINDOW = "allocate_slots: a block leaves a request's table only behind its sliding window"
WINDOW_DOC = ("With a sliding window of S tokens, the KV a request's next token attends to is its "
              "last S tokens: a call may replace a table entry by the null block (and release the "
              "block) only where the block holds none of them -- (i + 1) * block_size + S <= "
              "the request's tokens for its entry i (the spec's drop_behind_window; vLLM "
              "v0's BlockTable.append_token_ids drops what lies before max_block_sliding_window "
              "blocks back). The entry keeps its place, so the table's length is unchanged.")
FREED = "free: the request holds no block afterwards"
LIVENESS = "every request the pool can hold finishes within the bound"
COMPUTES = "a scheduled request computes at least one token"
COMPUTES_DOC = ("A request a step schedules has at least one token for the forward pass: the "
                "model samples from its last token's logits, so a prompt wholly in the cache "
                "still recomputes its last token (spec.prefix.cached_tokens; vLLM PR #11186, "
                "nano-vllm #144: seqlen_q = 0).")
LEAK = "no blocks leak at the end"
QUEUES = "a request is in one scheduler queue at most, and in running only while it runs"
QUEUES_DOC = ("The scheduler's running and waiting queues hold each request once at most, and "
              "the running queue only requests whose status is running: a preempted request "
              "leaves running as it joins waiting (nano-vllm-fork 20260210's decode loop "
              "preempts through Scheduler.preempt, which never removes it from running).")

