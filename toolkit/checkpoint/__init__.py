"""Checkpoints: the runner's checksummed files (files), every rank's DCP shards (sharded), what a running program
puts in one and takes back (run_state, state), DeepSpeed's own partitions (deepspeed), and the weights a run
starts from (init_weights).

Imports: specs, program."""

from .files import file_sha256, latest_checkpoint, list_checkpoints, resume_key, save_checkpoint, unwritable_checkpoint

__all__ = [
    "save_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "resume_key",
    "unwritable_checkpoint",
    "file_sha256",
]
