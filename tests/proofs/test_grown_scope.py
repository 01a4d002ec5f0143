"""``proofs.bmc.grown``: the larger scope that tells a class impossible at this scope (not
applicable) from one the spec makes impossible (violated)."""

from __future__ import annotations

from kvcheck.proofs.bmc import grown
from kvcheck.spec.symbolic import SymScope


def test_all_but_one_sequence_can_hold_the_whole_pool():
    """A fork runs out of blocks only when the other sequences hold the pool: at 8 blocks,
    3 slots and 6 tokens (3 blocks) each it never can, so the class is not applicable
    there, not a property the spec disproves (``kvcheck prove reference --blocks 8 ...``
    used to FAIL on it)."""
    g = grown(SymScope(8, 2, 3, 6))
    assert (g.seqs - 1) * -(-g.max_tokens // g.block_size) >= g.num_blocks
    assert g.num_blocks == 8 and g.seqs == 3 and g.max_tokens == 8


def test_never_smaller_than_the_scope():
    s = SymScope(4, 4, 5, 40)
    assert grown(s) == SymScope(4, 4, 5, 40)
    assert grown(SymScope(1, 1, 1, 1)) == SymScope(2, 2, 3, 6)
