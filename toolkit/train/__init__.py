"""Train: the runner: the job checked and written into its run folder, its ranks launched, the training loop, data,
metrics, trackers and the run's summary (torch).

Imports: specs, estimate, capability, export, runs, views, program, launch, checkpoint."""
