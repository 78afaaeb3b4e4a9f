"""Sparse Transformer attention: the layer and its patterns as splash masks."""
