"""Routing Transformer attention: the layer and its online k-means."""
