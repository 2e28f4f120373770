"""Stages: each a function from an input artifact and its slice of the recipe to an output artifact plus facts.

The engine (`rlopt.compile.engine`) runs them; a stage never calls another stage.
"""
