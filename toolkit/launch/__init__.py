"""Launch: what starts a rank on this host and keeps it honest: torchrun's environment, pinned threads for
bitwise repeatable CPU runs (determinism), and the supervised rank processes that train, generate and calibrate
start (ranks).

Imports: nothing of ours."""
