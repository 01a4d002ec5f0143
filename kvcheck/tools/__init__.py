"""Tools beside the checker: the block-size planner, the swap/recompute cost model and the
scheduler simulator."""
