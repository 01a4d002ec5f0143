"""The scheduler model: admission, decode order and preemption over a block manager."""
