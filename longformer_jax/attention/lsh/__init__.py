"""Reformer LSH attention: the layer and its scan over sorted hash chunks."""
