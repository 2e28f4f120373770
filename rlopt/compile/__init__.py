"""`rlopt compile`: recipe -> stages -> verified artifacts -> sealed manifest in MODEL_DIR."""
