"""Image Transformer local attention: the layer and its 1D pattern as a splash mask."""
