"""Export: a Job as the files other launchers read (accelerate and DeepSpeed configs, torchrun and Slurm
scripts), and a training run as a Hugging Face folder (hf: config, names and tokenizer; the weights come in as
numpy arrays). No torch; imports specs, estimate and capability, and the program imports the DeepSpeed config.

Imports: specs, estimate, capability."""
