"""Mathematical rules: algebra on one statement, and the softmax family over reductions."""
