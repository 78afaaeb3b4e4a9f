"""Vanilla softmax attention: the layer and its cuDNN flash path."""
