"""Attention with the chunk split over the `sequence` mesh axis: ring, all-gather, halo, zigzag."""
