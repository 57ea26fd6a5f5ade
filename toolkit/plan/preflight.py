"""Refuse, before any rank starts, a job this machine cannot hold: the estimate against its memory.

    check_fits(resolved_job, nproc)     # SpecError in one line, with the first change that fits

On a CPU every rank's tensors and its interpreter share the host's RAM; on GPUs each rank's device peak must fit
its device. Without this a model too large for the host ends in a 48-line allocator traceback or an OOM kill.
`toolkit train --force` skips it.
"""

from __future__ import annotations

from ..estimate.host import RANK_BASELINE_BYTES, host_available_bytes
from ..specs import Job, SpecError

__all__ = ["check_fits", "host_available_bytes", "RANK_BASELINE_BYTES"]


def _host_need(job: Job, nproc: int) -> float:
    from ..estimate.memory import memory_estimate

    mem = memory_estimate(job)  # (offloaded states are host memory too: on a CPU, the same RAM)
    return nproc * (float(mem.peak_bytes) + float(mem.host_bytes or 0.0) + RANK_BASELINE_BYTES)


def check_fits(job: Job, nproc: int, catalog=None) -> None:
    """Raise a one-line SpecError when the resolved job's estimated peak exceeds what this machine has."""
    if job.cluster.accelerator is not None:
        _check_device(job, catalog)
        return
    available = host_available_bytes()
    if available is None or not job.model.has_shape:
        return
    need = _host_need(job, nproc)
    if need <= available:
        return
    fix = _first_fix(job, nproc, available)
    raise SpecError(
        "--nproc",
        nproc,
        f"the job needs about {need / 2**30:.1f} GiB of this host's memory ({nproc} "
        f"rank(s): tensors at their estimated peak and {RANK_BASELINE_BYTES / 2**30:.1f} "
        f"GiB each for the interpreter) and {available / 2**30:.1f} GiB is available; "
        + (f"try {fix}, " if fix else "train fewer layers or a smaller micro-batch, ")
        + "or --force to start anyway",
    )


def _first_fix(job: Job, nproc: int, available: float) -> str | None:
    """The doctor's first single change (toolkit.plan.doctor.candidate_changes) that fits the host."""
    from .doctor import candidate_changes

    for what, changed in candidate_changes(job):
        try:
            resolved = changed.resolve()[0]
        except SpecError:
            continue
        if not what.startswith("expandable") and _host_need(resolved, nproc) <= available:
            return f"{what} ({_host_need(resolved, nproc) / 2**30:.1f} GiB)"
    return None


def _check_device(job: Job, catalog) -> None:
    """On GPUs: the estimate's device peak against the device (memory.fits), with the doctor's first fix."""
    from ..estimate import estimate
    from ..specs import load_catalog

    catalog = catalog or load_catalog()
    result = estimate(job, catalog)
    if result["memory"].get("fits") is not False:
        return
    from .doctor import diagnose_job

    fixes = [f for f in diagnose_job(job, catalog)["fixes"] if f["fits"]]
    raise SpecError(
        "cluster.accelerator",
        job.cluster.accelerator,
        f"the job's estimated peak, {result['memory']['device_peak_bytes'] / 2**30:.1f} GiB a device, "
        "does not fit; "
        + (f"try {fixes[0]['change']}, " if fixes else "see `toolkit doctor`, ")
        + "or --force to start anyway",
    )
