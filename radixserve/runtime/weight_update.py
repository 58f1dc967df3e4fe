"""SGLang's ``update_weights_from_disk``: the served model's weights replaced, between steps, by
another checkpoint of its shape (what an RL trainer calls after each training step), and the
prefix cache emptied, its KV having come from the old weights.

No request may hold KV while the weights change: its prefix and the tokens it has computed
would mix two models. So the update is refused while a request is running (SGLang instead
holds new requests and waits for those in flight to end). ``abort_all_requests`` (SGLang's
field) ends them first; so does ``/pause_generation`` in ``abort`` mode, and in ``retract``
mode it sends them back to the queue, where requests hold no KV: they are computed again under
the new weights after ``/continue_generation``. A pause ``in_place`` keeps their KV, so it is
refused too. ``weights_by_name`` reads a tensor back as served, SGLang's check of an update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixserve.runtime.io_struct import ReqOutput
from radixserve.runtime.pause import abort_all
from radixserve.runtime.scheduler import Scheduler

UPDATED = "Succeeded to update model weights."  # SGLang's message
LOAD_FORMATS = (None, "auto", "safetensors")  # what SGLang's load_format may say here


def updated(weight_version: str | None) -> str:
    """SGLang's message for an update that went through (naming the new label, if any)."""
    if weight_version is None:
        return UPDATED
    return f"{UPDATED} Weight version updated to {weight_version}."


def weights_by_name(scheduler: Scheduler, name: str, truncate_size: int = 100) -> list[Any]:
    """SGLang's ``get_weights_by_name``: the first ``truncate_size`` rows of the checkpoint
    tensor ``name`` as the served model holds it now (``models/weight_lookup.py``), as lists of
    floats; ``ValueError`` for an unknown name or a negative size."""
    if truncate_size < 0:
        raise ValueError(f"truncate_size must be at least 0; got {truncate_size}")
    rows: list[Any] = scheduler.worker.weight_by_name(name)[:truncate_size].tolist()
    return rows


def check_load_format(load_format: str | None) -> None:
    """``ValueError`` unless ``load_format`` names safetensors checkpoints (the only kind read)."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be auto or safetensors; got {load_format!r}")


def update_weights_from_disk(
    scheduler: Scheduler,
    model_path: str,
    deliver: Callable[[list[ReqOutput]], None],
    flush_cache: bool = True,
    abort_all_requests: bool = False,
) -> None:
    """Load ``model_path`` into the served model (``ModelRunner.update_weights_from_disk``),
    then, with ``flush_cache``, empty the prefix cache. ``ValueError`` (the weights unchanged)
    while requests run or where the checkpoint cannot serve as this model. The outputs it
    produces (the aborted requests' last, a batch in flight) go to ``deliver`` as a step's."""
    if abort_all_requests:
        deliver(abort_all(scheduler))
    scheduler.sync()  # the batch in flight, if any, is done with the old weights
    deliver(scheduler.take_outputs())
    running = sum(not r.is_finished for r in scheduler.running.reqs)
    running += scheduler.chunked_req is not None
    if running:
        raise ValueError(
            f"{running} request(s) are running: pause_generation with mode abort or retract "
            "(or abort_all_requests) first, or wait for them to finish"
        )
    scheduler.worker.update_weights_from_disk(model_path)
    if flush_cache and not scheduler.kv.flush():
        raise RuntimeError("the prefix cache could not be emptied with no request running")
