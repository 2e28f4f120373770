"""The tools that run over a compiled MODEL_DIR: `bench` and `warmup`.

Each is a package split by job: `schema` (the pydantic report), `driver` (running: processes, threads,
timing loops), `analysis` (statistics). Nothing here imports rich: rendering is the CLI's (`rlopt.render`).
"""
