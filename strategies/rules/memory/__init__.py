"""Memory-level rules: where intermediates live, how they are laid out, what is staged in caches."""
