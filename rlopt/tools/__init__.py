"""Tools over a recipe or a MODEL_DIR: bench, warmup, tune.

Each is a package split by job: `schema` (the pydantic report), `driver` (running: processes, threads,
timing loops), `analysis` (statistics). Nothing here imports rich: rendering is the CLI's (`rlopt.render`).
"""
