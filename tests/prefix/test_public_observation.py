"""The prefix model reads every target's cache through the public observation methods only
(issue 35 §1): kvcheck's own engine adapters implement them; an object showing an engine's
cache only through its private structure is not read."""

from __future__ import annotations

import types

import pytest

from kvcheck.engines import PREFIX_OBSERVATION
from kvcheck.impl.thirdparty import nano_vllm, vllm_v0, vllm_v1
from kvcheck.models.prefix.oracle import OBSERVATION, MethodView, view_for
from kvcheck.targets.loading import TargetError, build, resolve


def test_the_kit_names_the_methods_the_model_reads():
    assert PREFIX_OBSERVATION == OBSERVATION


@pytest.mark.parametrize("name", ["vllm-v1", "vllm-v0-prefix", "nano-vllm", "aphrodite",
                                  "sglang-radix", "prefix"])
def test_every_prefix_target_of_the_registry_is_read_through_the_methods(name):
    target = build(resolve(name)[1], 4, 2)  # (the bundled one seed-shaped: a SeedAdapter)
    view = view_for(target)
    assert type(view) is MethodView
    target.allocate(0, 4, token_ids=[1, 2, 3, 4])
    named = {b for _, b in view.entries()}
    assert named and named <= set(target.block_table(0))  # its full blocks, cached


@pytest.mark.parametrize("factory,inside", [
    (vllm_v1.make, "pool"),  # .pool.cached_block_hash_to_block: recognised before issue 35
    (nano_vllm.make, "manager"),  # .manager.hash_to_block_id
    (vllm_v0.make_prefix, "gpu"),  # .gpu._cached_blocks and .gpu.evictor
])
def test_an_engines_private_structure_alone_is_not_read(factory, inside):
    target = factory(4, 2)
    bare = types.SimpleNamespace(**{inside: getattr(target, inside)})
    with pytest.raises(TargetError, match="does not expose a prefix cache"):
        view_for(bare)
