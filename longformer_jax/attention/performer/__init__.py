"""Performer attention (FAVOR+): the layer, its linear-attention kernel and random features."""
