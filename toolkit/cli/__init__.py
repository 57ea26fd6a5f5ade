"""`toolkit`, the command line: the job commands (main), the catalog listing (catalog), the pipeline simulator
(pipeline) and the machine's calibration (calibrate).

Imports: specs, estimate, export, runs, plan, views, launch, trace, train, serve, calibrate."""

from .main import main

__all__ = ["main"]
