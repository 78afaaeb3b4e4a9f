"""Longformer attention: the layer, dilated windows and the two-sided cuDNN window."""
