"""Tools over a recipe or a MODEL_DIR: bench, warmup, tune."""
