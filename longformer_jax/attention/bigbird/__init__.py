"""BigBird attention: the layer and its patterns as splash masks."""
