"""Measure this machine and write its figures as a catalog profile: what one rank computes (kernels), the
collectives on the process group (comm), a GPU's own terms (device), and the profile they make (profile).

Imports: specs, estimate, runs, program, launch, trace, train."""

from .profile import calibrate

__all__ = ["calibrate"]
