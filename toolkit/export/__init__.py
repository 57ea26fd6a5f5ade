"""Export: a Job as the files other launchers read (accelerate and DeepSpeed configs, torchrun and Slurm
scripts). No torch; imports specs, estimate and capability, and the program imports the DeepSpeed config.

Imports: specs, estimate, capability."""
