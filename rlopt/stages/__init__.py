"""Compile stages: the interface every stage implements (`base.py`: Stage, Context, StageOutput), the front end every
backend shares (`frontend.py`) and the modules that do its work (script, export, profiles, padding, the weight map).

The engine (`rlopt.compile.engine`) runs them; a stage never calls another stage. A backend's own stages live in its
package (`rlopt/backends/<name>/stages.py`).
"""
