"""The prefix-cache model: the block manager plus the cache map, its lifecycle and cache hits
checked at the data level."""
