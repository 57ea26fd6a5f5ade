"""Measure this machine and write its figures as a catalog profile: what one rank computes (kernels), the
collectives on the process group (comm), a GPU's own terms (device), the serving server's host work (serve_host),
and the profile they make (profile).

Imports: specs, estimate, runs, program, launch, trace, train, serve."""

from .profile import calibrate

__all__ = ["calibrate"]
