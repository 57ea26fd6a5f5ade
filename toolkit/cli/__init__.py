"""`toolkit`, the command line: the job commands (main), the catalog listing (catalog), the pipeline simulator
(pipeline) and the machine's calibration (calibrate)."""

from .main import main

__all__ = ["main"]
